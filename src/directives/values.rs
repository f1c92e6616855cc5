//! The directives that set one value of a location: `rl_status CODE;`,
//! `rl_headers off | legacy | draft | both | draft-6 ...;`, `rl_dry_run on
//! | off;` and `rl_log_level info | notice | warn | error;`. One handler
//! reads them all, from a table that says, for each, the value it sets and
//! the words (or numbers) it takes; each refusal is worded as nginx's
//! `ngx_conf_set_*_slot` handlers word theirs.

use core::ffi::{c_char, c_void};

use ngx::ffi::{
    ngx_command_t, ngx_conf_t, ngx_str_t, ngx_uint_t, NGX_LOG_ERR, NGX_LOG_INFO, NGX_LOG_NOTICE, NGX_LOG_WARN,
};
use ngx::ngx_conf_log_error;
use rl_core::parse::parse_number;
use rl_core::spec::{one_of, Quote};

use super::{args, arguments, text};
use crate::conf::{self, refuse, ConfError, Given, LocConf};
use crate::line::HeadersMode;

/// How a directive's arguments read.
enum Read<T: 'static> {
    /// One word of the list; in any case where `any_case`, as
    /// `ngx_conf_set_flag_slot` reads `on` and `off`.
    Word { words: &'static [(&'static str, T)], any_case: bool },
    /// `alone` by itself, or words of the list, their values together. A
    /// word given twice is a warning, as it is for nginx's bitmask
    /// directives (`ssl_protocols`, `proxy_next_upstream`).
    Words { alone: (&'static str, T), words: &'static [(&'static str, T)], with: fn(T, T) -> T, has: fn(T, T) -> bool },
    /// A number from `min` to `max`, which the message calls `what`.
    Number { what: &'static str, min: u64, max: u64, of: fn(u64) -> Option<T> },
}

/// A directive of the table: its name, the value it sets and how its
/// arguments read.
struct Setting<T: 'static> {
    name: &'static str,
    slot: fn(&mut Given) -> &mut Option<T>,
    read: Read<T>,
}

const STATUS: Setting<ngx_uint_t> = Setting {
    name: "rl_status",
    slot: |g| &mut g.status,
    read: Read::Number { what: "status", min: 400, max: 599, of: |n| ngx_uint_t::try_from(n).ok() },
};

/// `off` alone, or any of the others, whose fields are all sent (`legacy
/// draft` is `both`).
const HEADERS: Setting<HeadersMode> = Setting {
    name: "rl_headers",
    slot: |g| &mut g.headers,
    read: Read::Words {
        alone: ("off", HeadersMode::OFF),
        words: &[
            ("legacy", HeadersMode::LEGACY),
            ("draft", HeadersMode::DRAFT),
            ("both", HeadersMode::BOTH),
            ("draft-6", HeadersMode::DRAFT6),
        ],
        with: HeadersMode::with,
        has: HeadersMode::has,
    },
};

const DRY_RUN: Setting<bool> = Setting {
    name: "rl_dry_run",
    slot: |g| &mut g.dry_run,
    read: Read::Word { words: &[("on", true), ("off", false)], any_case: true },
};

const LOG_LEVEL: Setting<ngx_uint_t> = Setting {
    name: "rl_log_level",
    slot: |g| &mut g.log_level,
    read: Read::Word {
        words: &[
            ("info", NGX_LOG_INFO as ngx_uint_t),
            ("notice", NGX_LOG_NOTICE as ngx_uint_t),
            ("warn", NGX_LOG_WARN as ngx_uint_t),
            ("error", NGX_LOG_ERR as ngx_uint_t),
        ],
        any_case: false,
    },
};

/// A row of the table, whatever the type of its value.
trait Set {
    fn name(&self) -> &'static str;
    fn set(&self, cf: *mut ngx_conf_t, given: &mut Given, args: &[ngx_str_t]) -> Result<(), ConfError>;
}

static TABLE: [&(dyn Set + Sync); 4] = [&STATUS, &HEADERS, &DRY_RUN, &LOG_LEVEL];

/// The handler of every directive of [`TABLE`].
pub extern "C" fn cmd_value(cf: *mut ngx_conf_t, cmd: *mut ngx_command_t, conf: *mut c_void) -> *mut c_char {
    // SAFETY: the location configuration of this module (NGX_HTTP_LOC_CONF_OFFSET).
    let lcf = unsafe { &mut *conf.cast::<LocConf>() };
    // SAFETY: called by nginx while parsing, cf is valid; cmd is the entry of our command table
    // that nginx matched, whose name is a static string.
    let (args, name) = unsafe { (args(cf), text(&(*cmd).name)) };
    let result = match TABLE.iter().find(|row| row.name() == name) {
        Some(row) => row.set(cf, &mut lcf.given, args),
        None => Err(ConfError::refused(format_args!("unknown directive \"{name}\""))),
    };
    conf::at_directive(cf, result)
}

impl<T: Copy + PartialEq> Set for Setting<T> {
    fn name(&self) -> &'static str {
        self.name
    }

    fn set(&self, cf: *mut ngx_conf_t, given: &mut Given, args: &[ngx_str_t]) -> Result<(), ConfError> {
        let name = self.name;
        let slot = (self.slot)(given);
        if slot.is_some() {
            refuse!("\"{name}\" directive is duplicate");
        }
        // (nginx has checked the number of arguments: NGX_CONF_TAKE1, FLAG or 1MORE)
        let values = args.get(1..).unwrap_or_default();
        let Some(first) = values.first() else {
            return Err(arguments(name));
        };
        let invalid = |arg: &ngx_str_t, must: &str| {
            ConfError::refused(format_args!(
                "invalid value \"{}\" in \"{name}\" directive, it must be {must}",
                Quote(&arg.to_string())
            ))
        };
        let list = |words: &[(&str, T)]| one_of(&words.iter().map(|(w, _)| *w).collect::<Vec<_>>());
        *slot = Some(match &self.read {
            Read::Word { words, any_case } => {
                let v = text(first);
                let found = words.iter().find(|(w, _)| if *any_case { w.eq_ignore_ascii_case(v) } else { *w == v });
                found.ok_or_else(|| invalid(first, &list(words)))?.1
            }
            Read::Words { alone, words, with, has } => {
                let mut all = alone.1;
                for arg in values {
                    let one = match text(arg) {
                        w if w == alone.0 && values.len() == 1 => alone.1,
                        w if w == alone.0 => return Err(invalid(arg, "the only value")),
                        w => match words.iter().find(|(word, _)| *word == w) {
                            Some((_, one)) => *one,
                            None => return Err(invalid(arg, &list(&[&[*alone], *words].concat()))),
                        },
                    };
                    if one != alone.1 && has(all, one) {
                        let arg = Quote(&arg.to_string());
                        ngx_conf_log_error!(NGX_LOG_WARN, cf, "duplicate value \"{}\" in \"{}\" directive", arg, name);
                    }
                    all = with(all, one);
                }
                all
            }
            Read::Number { what, min, max, of } => {
                let n = parse_number(text(first)).ok().filter(|n| (*min..=*max).contains(n));
                let Some(value) = n.and_then(*of) else {
                    refuse!(
                        "invalid {what} \"{}\" in \"{name}\" directive, it must be between {min} and {max}",
                        Quote(&first.to_string())
                    );
                };
                value
            }
        });
        Ok(())
    }
}
