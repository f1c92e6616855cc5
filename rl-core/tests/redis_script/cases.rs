//! Table-driven and example tests: the script's answers, writes and TTLs
//! on hand-picked cases, malformed and out-of-range arguments, the Rust side
//! of the interface (keys, arguments, replies), batches and the function
//! library.

use rl_core::limit::{Algorithm, Limit};
use rl_core::redis::{
    charge_args, charge_function_name, charge_script, function_library, function_name, parse_charge_reply, write_spec,
    ChargeReply, LineArg,
};
use rl_core::redis::{
    exact, key_tag, parse_reply, script_args, state_key, tag_of, write_state_key, Call, ScriptReply, LIMIT_SCRIPT,
    MAX_EXACT, TTL_MARGIN_MS, TTL_SLACK_MS,
};
use rl_core::verdict::Outcome;

use crate::fixtures::{case_limit, keys, limit, T0};
use crate::harness::{put_raw, Mode, Redis};
use crate::model::{model, stored};
use crate::pair::Pair;

/// A request: its lines, each a limit and a cost.
type Request<'a> = &'a [(Limit, u64)];

#[test]
fn cases_first_exhaust_retry_cost() {
    for alg in Algorithm::ALL {
        let l = case_limit(alg);
        let mut p = Pair::new(&[(l, 1)]);
        let one = |p: &mut Pair, now, cost| p.step(&[(l, cost)], now, true, false).1[0];
        // First request: admitted, burst - 1 left.
        let o = one(&mut p, T0, 1);
        assert!(o.admitted && o.remaining == 2 && o.retry_after_us.is_none(), "{alg}: {o:?}");
        assert!(o.reset_us > 0);
        // Exhaust the burst within the same microsecond.
        assert_eq!(one(&mut p, T0, 1).remaining, 1);
        assert_eq!(one(&mut p, T0, 1).remaining, 0);
        // Rejected, with an exact retry-after.
        let o = one(&mut p, T0 + 10, 1);
        assert!(!o.admitted && o.remaining == 0, "{alg}: {o:?}");
        let d = o.retry_after_us.expect("retry-after");
        let expect = match alg {
            Algorithm::Fixed | Algorithm::SlidingLog => 1_500_000 - 10,
            Algorithm::Sliding => 1_500_000 - 10 + 500_000,
            _ => 500_000 - 10,
        };
        assert_eq!(d, expect, "{alg}");
        // Still rejected one microsecond before, admitted at retry-after.
        assert!(!one(&mut p, T0 + 10 + d - 1, 1).admitted, "{alg}");
        assert!(one(&mut p, T0 + 10 + d, 1).admitted, "{alg}");
        // Cost 0 always passes; cost > burst never (no retry-after).
        assert!(one(&mut p, T0 + 10 + d, 0).admitted);
        let o = one(&mut p, T0 + 10 + d, 4);
        assert!(!o.admitted && o.retry_after_us.is_none(), "{alg}: {o:?}");
    }
}

#[test]
fn cases_cost_above_one() {
    for alg in Algorithm::ALL {
        let l = case_limit(alg);
        let mut p = Pair::new(&[(l, 1)]);
        let one = |p: &mut Pair, now, cost| p.step(&[(l, cost)], now, true, true).1[0];
        let o = one(&mut p, T0, 2);
        assert!(o.admitted && o.remaining == 1, "{alg}: {o:?}");
        let o = one(&mut p, T0 + 1, 2);
        assert!(!o.admitted && o.remaining == 1, "{alg}: {o:?}");
        let d = o.retry_after_us.unwrap();
        assert!(!one(&mut p, T0 + 1 + d - 1, 2).admitted, "{alg}");
        let o = one(&mut p, T0 + 1 + d, 2);
        assert!(o.admitted, "{alg}: {o:?}");
        // A full-burst request on a fresh key.
        let mut p = Pair::new(&[(l, 1)]);
        let o = p.step(&[(l, 3)], T0, true, true).1[0];
        assert!(o.admitted && o.remaining == 0, "{alg}: {o:?}");
    }
}

#[test]
fn cases_fixed_boundary() {
    let l = case_limit(Algorithm::Fixed);
    let mut p = Pair::new(&[(l, 1)]);
    let end = T0 + 1_500_000;
    // Burst at the very end of a window, then again at the start of the next.
    let o = p.step(&[(l, 3)], end - 1, true, false).1[0];
    assert!(o.admitted && o.reset_us == 1);
    let o = p.step(&[(l, 1)], end - 1, true, false).1[0];
    assert_eq!(o.retry_after_us, Some(1));
    let o = p.step(&[(l, 3)], end, true, false).1[0];
    assert!(o.admitted && o.remaining == 0 && o.reset_us == 1_500_000);
}

#[test]
fn cases_sliding_weights_previous_window() {
    let l = case_limit(Algorithm::Sliding);
    let mut p = Pair::new(&[(l, 1)]);
    p.step(&[(l, 3)], T0, true, false);
    // Half-way into the next window the previous one weighs 1.5: one fits.
    let o = p.step(&[(l, 1)], T0 + 2_250_000, true, false).1[0];
    assert!(o.admitted && o.remaining == 0, "{o:?}");
    // The next needs the previous window to weigh 1: at 2/3 of the window.
    let o = p.step(&[(l, 1)], T0 + 2_250_000, true, false).1[0];
    assert!(!o.admitted && o.retry_after_us == Some(250_000), "{o:?}");
}

/// A busy key's TTL is set about once per TTL_SLACK_MS; the writes between
/// keep its expiry (which always covers the state's reset + margin: `step`
/// checks it) and overwrite the value in place.
#[test]
fn busy_key_sets_its_ttl_once_per_slack() {
    use Algorithm::*;
    for alg in [Fixed, Sliding, TokenBucket, LeakyBucket, Gcra] {
        // 1000 r/s, burst 100 (fixed windows of 100 ms), 1 request per
        // 10 ms for 3 s: all admitted.
        let l = limit(alg, 1000, 1_000_000, 100);
        let mut p = Pair::new(&[(l, 1)]);
        for i in 0..300 {
            assert!(p.step(&[(l, 1)], T0 + i * 10_000, true, false).0, "{alg}");
        }
        let (sets, in_place) = (p.redis.count("SET"), p.redis.count("SETRANGE"));
        assert_eq!(sets + in_place, 300, "{alg}");
        assert!((3..=4).contains(&sets), "{alg}: {sets} SET ... PX in 3 s");
    }
}

#[test]
fn expired_key_reads_as_fresh() {
    for alg in Algorithm::ALL {
        let l = case_limit(alg);
        let mut p = Pair::new(&[(l, 1)]);
        let o = p.step(&[(l, 3)], T0, true, false).1[0];
        let key = p.keys[0].clone();
        let exp = p.redis.expiry(&key).unwrap();
        let slack = if alg == Algorithm::SlidingLog { 0 } else { TTL_SLACK_MS * 1000 };
        assert_eq!(exp, T0 + o.reset_us.div_ceil(1000) * 1000 + 1_000_000 + slack);
        p.redis.set_now(exp - 1);
        assert!(p.redis.value(&key).is_some(), "{alg}");
        p.redis.set_now(exp);
        assert!(p.redis.value(&key).is_none(), "{alg}");
        // The model, which never expires, agrees with the emptied store.
        let o = p.step(&[(l, 3)], exp, true, false).1[0];
        assert!(o.admitted && o.remaining == 0, "{alg}: {o:?}");
    }
}

/// State the script did not write (another algorithm's words, whitespace,
/// exponents, fractions, junk, missing words, a key of the wrong type) reads
/// as the model's words: each of the first tokens as a number, floored, 0 if
/// it is not a non-negative number, missing words 0; a wrong type is fresh.
/// Then the first write stores the model's state word for word.
#[test]
fn foreign_state_reads_like_the_model() {
    // Plausible words at T0 for each algorithm (W = 1.5 s, T = 0.5 s).
    let k1 = T0 / 1_500_000 + 1;
    for alg in Algorithm::ALL {
        let l = case_limit(alg);
        let words: Vec<u64> = match alg {
            Algorithm::Fixed => vec![k1, 2],
            Algorithm::Sliding => vec![k1, 1, 2],
            Algorithm::TokenBucket | Algorithm::LeakyBucket => vec![1_500_000, T0 - 200_000],
            Algorithm::Gcra => vec![T0 + 700_000],
            Algorithm::Concurrent => unreachable!("never on Redis"),
            Algorithm::SlidingLog => {
                // Only a wrong-type key: a string where a LIST belongs.
                let mut p = Pair::new(&[(l, 1)]);
                p.redis.set_now(T0);
                put_raw(&p.redis, &p.keys[0], "1 2", false);
                let o = p.step(&[(l, 3)], T0, true, false).1[0];
                assert!(o.admitted && o.remaining == 0, "{o:?}");
                continue;
            }
        };
        let n = words.len();
        let joined = |w: &[u64], sep: &str| w.iter().map(u64::to_string).collect::<Vec<_>>().join(sep);
        let with = |i: usize, x: u64| {
            let mut w = words.clone();
            w[i] = x;
            w
        };
        let mut cases: Vec<(String, Vec<u64>, bool)> = vec![
            (joined(&words, " "), words.clone(), false),
            (format!("\t {} \n", joined(&words, " \t\r ")), words.clone(), false),
            (format!("{} 77 x", joined(&words, " ")), words.clone(), false),
            (format!("{}e0", joined(&words, "e0 ")), words.clone(), false),
            (format!("{}.75", joined(&words, ".25 ")), words.clone(), false),
            (
                format!("{}", words[0]),
                with(0, words[0]).iter().take(1).chain(&vec![0; n - 1]).copied().collect(),
                false,
            ),
            (String::new(), vec![0; n], false),
            ("   ".to_owned(), vec![0; n], false),
            (joined(&words, " "), vec![0; n], true),
        ];
        for (i, bad) in ["x", "-5", "nan", "-inf"].iter().enumerate() {
            let mut toks: Vec<String> = words.iter().map(u64::to_string).collect();
            let j = i % n;
            toks[j] = bad.to_string();
            cases.push((toks.join(" "), with(j, 0), false));
        }
        for (raw, state, list) in cases {
            for cost in [1, 3] {
                let r = Redis::new();
                let k = keys(1);
                let now = T0 + 10;
                r.set_now(now);
                put_raw(&r, &k[0], &raw, list);
                let want = l.check(&state, now, cost);
                let what = format!("{alg} {raw:?} list={list} cost={cost}");
                // Check only: the model's outcome, nothing written.
                let (_, out) = r.run(&k, &[(l, cost)], now, false, false);
                assert_eq!(out[0], want, "{what}");
                assert_eq!(r.writes(), 0, "{what}");
                // Commit: the same, and the model's state if admitted.
                let (_, out) = r.run(&k, &[(l, cost)], now, true, false);
                assert_eq!(out[0], want, "{what}");
                if want.admitted {
                    let mut s = state.clone();
                    l.commit(&mut s, now, cost);
                    assert_eq!(r.value(&k[0]), Some(stored(&l, &s)), "{what}");
                    assert_eq!(r.kind(&k[0]).as_deref(), Some("string"), "{what}");
                    // (from now rounded up to the ms: expiry_after_write)
                    let mut ttl_ms =
                        want.reset_us.div_ceil(1000) + TTL_MARGIN_MS + u64::from(!now.is_multiple_of(1000));
                    if alg != Algorithm::SlidingLog {
                        ttl_ms += TTL_SLACK_MS; // the raw value carried no expiry
                    }
                    assert_eq!(r.expiry(&k[0]), Some(now + ttl_ms * 1000), "{what}");
                } else {
                    assert_eq!(r.writes(), 0, "{what}");
                }
            }
        }
    }
}

/// Words and TTLs print exactly at the edges of the script's integer
/// formatting: below 10^8, low halves with leading zeros, multiples of 10^8,
/// words of 10^8 and more besides a big first word, and up to 2^53.
#[test]
fn words_print_exactly() {
    use Algorithm::*;
    let e = MAX_EXACT;
    let t = 1_700_000_000_000_000;
    let cases: [(Limit, u64, &[u64]); 12] = [
        (limit(Gcra, 1, 1_000_000, 1), 1, &[5, 99_000_000, t, t + 99_000_000, t + 3, e]),
        // TAT = 2^53 exactly.
        (limit(Gcra, 1, e / 2, 2), 2, &[e]),
        (limit(TokenBucket, 1, 100_000_000, 3), 1, &[5, 99_999_999, t, t + 1, e]),
        (limit(LeakyBucket, 1, 7, 1 << 40), 1 << 38, &[3, t, e]),
        (limit(TokenBucket, 1, 1_000, 3), 1, &[3, t, t + 5, e]),
        (limit(Fixed, 1, 1, 200_000_000), 150_000_000, &[7, t, e]),
        (limit(Fixed, 1, 1_000, 3), 1, &[99_999_999, 100_000_000, t, t + 5, e]),
        (limit(Sliding, 1, 1, 200_000_000), 150_000_000, &[7, t + 1, e]),
        (limit(Sliding, 1, 10, 3), 1, &[99_999_999, t, t + 30, e]),
        // W = 1: the window index is now, its low half 0000000x.
        (limit(Fixed, 1, 1, 1), 1, &[t + 4, e]),
        (limit(Sliding, 1, 1, 1), 1, &[t + 4, e]),
        (limit(SlidingLog, 1, 10, 3), 1, &[5, t, e]),
    ];
    for (l, cost, times) in cases {
        let mut p = Pair::new(&[(l, cost)]);
        for &now in times {
            p.step(&[(l, cost)], now, true, false);
            p.step(&[(l, 1)], now, true, false);
        }
    }
}

#[test]
fn check_only_never_writes() {
    for alg in Algorithm::ALL {
        let l = case_limit(alg);
        let mut p = Pair::new(&[(l, 1)]);
        // On a fresh key: nothing is created.
        let o = p.step(&[(l, 1)], T0, false, false).1[0];
        assert!(o.admitted && p.redis.snapshot().is_empty(), "{alg}");
        assert_eq!(p.redis.writes(), 0);
        p.step(&[(l, 2)], T0, true, false);
        // On an existing key: admitted and rejected checks leave it alone.
        for cost in [1, 2, 3, 0] {
            let before = p.redis.snapshot();
            p.step(&[(l, cost)], T0 + 5, false, false);
            assert_eq!(p.redis.snapshot(), before);
        }
    }
}

#[test]
fn multi_line_all_or_nothing() {
    let a = limit(Algorithm::Gcra, 10, 1_000_000, 5);
    let b = limit(Algorithm::SlidingLog, 1, 1_000_000, 2);
    let c = limit(Algorithm::Fixed, 100, 60_000_000, 100);
    let lines = [(a, 1), (b, 1), (c, 1)];
    let mut p = Pair::new(&lines);
    assert!(p.step(&lines, T0, true, false).0);
    assert!(p.step(&lines, T0, true, false).0);
    // `b` rejects: nothing is charged on `a` or `c` either, and they report
    // what they have left.
    let (all, out) = p.step(&lines, T0, true, false);
    assert!(!all && out[0].admitted && !out[1].admitted && out[2].admitted);
    assert_eq!(out[0].remaining, 3);
    assert_eq!(out[2].remaining, 98);
    assert_eq!(out[1].retry_after_us, Some(2_000_000));
}

#[test]
fn out_of_range_fails_closed() {
    let k = keys(1);
    let r = Redis::new();
    r.set_now(T0);
    let reject = vec![T0 as i64, 0, 0, -1, 0, 0];
    let bad = [
        "nope 1 1000000 1 1 0 0",
        "gcra 0 1000000 1 1 0 0",
        "gcra 1 0 1 1 0 0",
        "gcra 1 1000000 0 1 0 0",
        "gcra 1 1000000 1 -1 0 0",
        "gcra 1 1000000 1 1.5 0 0",
        "gcra 1 1000000 1 x 0 0",
        "gcra 1 1000000 x 1 0 0",
        "gcra 1 1000000 1 1 0",
        "gcra 1 1000000 1 1",
        "gcra 1  1000000 1 1 0 0",
        "gcra 1 1000000 1 1 0 0 1",
        "gcra 1 1000000 9007199254740992 1 0 0",
        "gcra 1 1000000 1 9007199254740992 0 0",
        "token_bucket 1 4503599627370497 1 1 0 0",
        // queue and flags: an integer >= 0, 0 to 7; a queue only for the
        // buckets and gcra, and burst + queue in the exact range.
        "gcra 1 1000000 1 1 -1 0",
        "gcra 1 1000000 1 1 1.5 0",
        "gcra 1 1000000 1 1 0 16",
        "gcra 1 1000000 1 1 0 07",
        "gcra 1 1000000 1 1 0 010",
        "gcra 1 1000000 1 1 0 x",
        "fixed 1 1000000 1 1 1 0",
        "sliding 1 1000000 1 1 1 1",
        "sliding_log 1 1000000 1 1 1 0",
        "token_bucket 1 2 2251799813685248 1 1 0",
        "leaky_bucket 1 2 2251799813685248 1 1 1",
        "gcra 1 2 2251799813685248 1 1 0",
    ];
    let args = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    for line in bad {
        assert_eq!(r.eval(&k, &args(&["1", "", "", line])), reject, "{line:?}");
        assert_eq!(r.eval(&k, &args(&["1", "", "", "1", line])), reject, "{line:?}");
    }
    // Missing arguments, or a missing key.
    assert_eq!(r.eval(&k, &args(&["1", "", "", "1"])), reject);
    assert_eq!(r.eval(&[], &args(&["1", "", "", "gcra 1 1000000 1 1 0 0"])), reject);
    // No request: just the time. A malformed line count: an error reply.
    assert_eq!(r.eval(&k, &args(&["1", "", ""])), [T0 as i64]);
    assert_eq!(r.eval(&k, &args(&["1", "", "", "0"])), [T0 as i64]);
    // A malformed count, or a run of more requests than there are keys.
    for n in ["1.5", "-1.5", "-2"] {
        let reply = r.eval_table(&k, &args(&["1", "", "", n, "gcra 1 1000000 1 1 0 0"]));
        let err: String = reply.raw_get("err").unwrap();
        assert_eq!(err, "rl: malformed arguments", "{n:?}");
    }
    // A run whose line is not a line: each of its requests fails closed.
    let k3 = keys(3);
    for line in ["nope 1 1000000 1 1 0 0", "2", "-1"] {
        let want: Vec<i64> = [T0 as i64].into_iter().chain(reject[1..].repeat(3)).collect();
        assert_eq!(r.eval(&k3, &args(&["1", "", "", "-3", line])), want, "{line:?}");
    }
    assert_eq!(r.eval(&k3, &args(&["1", "", "", "-3"])).len(), 1 + 3 * 5);
    assert_eq!(r.eval(&k, &args(&["1", "", "", "-0"])), [T0 as i64]);
    // No deadline argument at all: none. A malformed deadline: an error reply.
    assert_eq!(r.eval(&k, &args(&["1", ""])), [T0 as i64]);
    for d in ["x", "1e", " "] {
        let reply = r.eval_table(&k, &args(&["1", "", d, "gcra 1 1000000 1 1 0 0"]));
        let err: String = reply.raw_get("err").unwrap();
        assert_eq!(err, "rl: malformed arguments", "{d:?}");
    }
    assert_eq!(r.writes(), 0);
    // Beyond 2^52 µs (year 2112) every line fails closed.
    let l = case_limit(Algorithm::Gcra);
    let (all, out) = r.run(&k, &[(l, 1)], MAX_EXACT + 1, true, false);
    assert!(!all && out[0].retry_after_us.is_none());
    let (all, _) = r.run(&k, &[(l, 1)], MAX_EXACT, true, false);
    assert!(all);
    assert_eq!(r.writes(), 1);
}

/// A call with a deadline (Redis time, µs): run at or before it, it is the
/// model's call; run after it, it reads and writes nothing and answers
/// `{-1, now}`, whether its clock is Redis `TIME` or the given time, as a
/// function or through `EVALSHA`, committing or checking only. A late call
/// changes nothing for the calls after it (the model, which never saw it,
/// still agrees).
#[test]
fn deadline_before_at_after() {
    for mode in [Mode::Function, Mode::Eval] {
        for alg in Algorithm::ALL {
            let l = case_limit(alg);
            let mut p = Pair::with(mode, &[(l, 1)]);
            let mut t = T0;
            for (use_time, commit) in [(false, true), (true, true), (false, false), (true, false)] {
                for cost in [1, 2, 0] {
                    let what = format!("{mode:?} {alg} use_time={use_time} commit={commit} cost={cost}");
                    let lines = [(l, cost)];
                    assert!(p.step_until(&lines, t, commit, use_time, Some(t + 1)).is_some(), "before: {what}");
                    assert!(p.step_until(&lines, t, commit, use_time, Some(t)).is_some(), "at: {what}");
                    assert!(p.step_until(&lines, t, commit, use_time, Some(t - 1)).is_none(), "after: {what}");
                    assert!(p.step_until(&lines, t, commit, use_time, Some(0)).is_none(), "long after: {what}");
                    assert!(p.step_until(&lines, t, commit, use_time, None).is_some(), "none: {what}");
                    t += 400_000;
                }
            }
        }
    }
    // The raw reply of a late call: -1, then Redis' time.
    let r = Redis::new();
    r.set_now(T0);
    let args: Vec<String> = ["1", "", &(T0 - 1).to_string(), "gcra 1 1000000 1 1 0 0"].map(String::from).to_vec();
    assert_eq!(r.eval(&keys(1), &args), [-1, T0 as i64]);
    assert_eq!((r.count("TIME"), r.count("MGET"), r.writes()), (1, 0, 0));
}

/// A batch is all late or all in time: late, none of its requests is
/// evaluated, whatever they are; in time, it is its requests one by one.
#[test]
fn deadline_of_a_batch() {
    let a = limit(Algorithm::Gcra, 10, 1_000_000, 3);
    let b = limit(Algorithm::SlidingLog, 1, 1_000_000, 2);
    let (one, two): (Request, Request) = (&[(a, 1)], &[(a, 1), (b, 1)]);
    let batch = [one, two, one, one, two];
    let k = keys(2);
    let bkeys: Vec<String> = batch.iter().flat_map(|r| k[..r.len()].to_vec()).collect();
    for mode in [Mode::Function, Mode::Eval] {
        let r = Redis::with(mode);
        let s = Redis::with(mode);
        assert_eq!(r.run_until(&bkeys, &batch, T0, true, true, Some(T0 - 1)), None, "{mode:?}");
        assert_eq!(r.snapshot(), "", "{mode:?}");
        let got = r.run_until(&bkeys, &batch, T0, true, true, Some(T0)).expect("in time");
        assert_eq!(got, s.run_batch(&bkeys, &batch, T0, true, true), "{mode:?}");
        let admitted: Vec<bool> = got.iter().map(|o| o.0).collect();
        assert_eq!(admitted, [true, true, true, false, false], "{mode:?}");
        // Late again: the state stays as the batch in time left it.
        let before = r.snapshot();
        assert_eq!(r.run_until(&bkeys, &batch, T0 + 5, true, false, Some(T0 + 4)), None, "{mode:?}");
        assert_eq!(r.snapshot(), before, "{mode:?}");
    }
}

#[test]
fn exact_range_boundaries() {
    use Algorithm::*;
    let e = MAX_EXACT;
    let cases = [
        (limit(TokenBucket, 1, e, 1), true),
        (limit(TokenBucket, 1, e + 1, 1), false),
        (limit(LeakyBucket, 7, e / 4, 4), true),
        (limit(LeakyBucket, 7, e / 4 + 1, 4), false),
        (limit(Gcra, 3, 3 * (e / 8), 8), true),
        (limit(Gcra, 3, 3 * (e / 8) + 1, 8), false),
        (limit(Fixed, 2, e, 2), true),
        (limit(Fixed, 2, e + 1, 2), false),
        (limit(SlidingLog, 2, e, 2), true),
        (limit(SlidingLog, 1, e + 1, 1), false),
        (limit(Sliding, 2, e, 1), true),
        (limit(Sliding, 2, e + 1, 1), false),
        (limit(Sliding, 1, e / 2 + 1, 1), false),
        (limit(Gcra, 1 << 53, 1, 1), false),
        (limit(Gcra, (1 << 53) - 1, 1, 1), true),
        // A day's quota of 10,000.
        (limit(Sliding, 10_000, 86_400_000_000, 10_000), true),
        (limit(TokenBucket, 10_000, 86_400_000_000, 10_000), true),
        // A varying window line's count carries into another window: its
        // burst too must stay within the range.
        (limit(Sliding, 4, 1, e), true),
        (limit(Sliding, 4, 1, e).varying(), true),
        (limit(Sliding, 4, 1, e + 1), true),
        (limit(Sliding, 4, 1, e + 1).varying(), false),
        (limit(Fixed, 4, 1, e + 1).varying(), false),
        (limit(Gcra, 3, 3 * (e / 8), 8).varying(), true),
        // A varying bucket's tag packs its rate: a unit's index and the
        // count, up to 2^48 a unit; another period and the count, up to
        // 2^18 at 1000 µs.
        (limit(TokenBucket, 1 << 48, 1_000_000, 1), true),
        (limit(TokenBucket, 1 << 48, 1_000_000, 1).varying(), true),
        (limit(TokenBucket, (1 << 48) + 1, 1_000_000, 1), true),
        (limit(TokenBucket, (1 << 48) + 1, 1_000_000, 1).varying(), false),
        (limit(LeakyBucket, (1 << 48) + 1, 86_400_000_000, 1).varying(), false),
        (limit(LeakyBucket, 1 << 18, 1000, 1).varying(), true),
        (limit(LeakyBucket, (1 << 18) + 1, 1000, 1).varying(), false),
    ];
    for (l, want) in cases {
        assert_eq!(exact(&l), want, "{l:?}");
        // The script agrees: a fresh key admits a lone request iff exact.
        let r = Redis::new();
        let (all, out) = r.run(&keys(1), &[(l, 1)], T0, true, false);
        assert_eq!(all, want, "{l:?}: {out:?}");
    }
}

/// Sliding with the previous window's weight `prev·(W−e)/W` beyond 2^53:
/// plain doubles would round 766.000…001 down to 766 and over-admit.
#[test]
fn sliding_products_beyond_2_53() {
    let (b, p, w) = (1000, 2_251_799_813_685, 2_251_799_813_685_000);
    let l = limit(Algorithm::Sliding, 1, p, b);
    assert_eq!(l.window_us(), w);
    // 997·(W − E) = 766·W + 1.
    let e = 521_730_949_810_667;
    let mut pair = Pair::new(&[(l, 1)]);
    assert!(pair.step(&[(l, 997)], 5, true, false).0);
    let o = pair.step(&[(l, 234)], w + e - 10, true, false).1[0];
    assert_eq!((o.admitted, o.retry_after_us), (false, Some(11)));
    let o = pair.step(&[(l, 234)], w + e, true, false).1[0];
    assert!(!o.admitted && o.remaining == 233, "{o:?}");
    let o = pair.step(&[(l, 234)], w + e + 1, true, false).1[0];
    assert!(o.admitted && o.remaining == 0, "{o:?}");
}

#[test]
fn rust_interface() {
    let tag = key_tag(b"203.0.113.7");
    assert_eq!(tag.len(), 16);
    assert!(tag.bytes().all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()));
    assert_eq!(tag, key_tag(b"203.0.113.7"));
    assert_ne!(tag, key_tag(b"203.0.113.8"));
    // Pinned: the tag must not change across builds or hosts.
    assert_eq!(key_tag(b""), "d1fba762150c532c");
    // Keys carry the tag as hex in a Cluster hash tag; writing appends.
    let mut k = String::from("x");
    write_state_key(&mut k, "rl:", tag_of(b"203.0.113.7"), 0x2a);
    assert_eq!(k, format!("xrl:{{{tag}}}:000000000000002a"));
    assert_eq!(state_key("rl:", 0x0123456789abcdef, 0x2a), "rl:{0123456789abcdef}:000000000000002a");
    let l = limit(Algorithm::TokenBucket, 10, 60_000_000, 20);
    let g = limit(Algorithm::Gcra, 1, 1_000_000, 1);
    let (a, b): (Request, Request) = (&[(l, 3), (g, 1)], &[(g, 2)]);
    let c: &[(Limit, u64)] = &[];
    assert_eq!(
        script_args([a, b, c, b], Call { commit: true, ..Call::default() }),
        [
            "1",
            "",
            "",
            "2",
            "token_bucket 10 60000000 20 3 0 0",
            "gcra 1 1000000 1 1 0 0",
            "gcra 1 1000000 1 2 0 0",
            "0",
            "gcra 1 1000000 1 2 0 0"
        ]
    );
    assert_eq!(
        script_args::<(Limit, u64)>([], Call { commit: false, now_us: Some(42), deadline_us: None, memo: false }),
        ["0", "42", ""]
    );
    assert_eq!(
        script_args::<(Limit, u64)>([], Call { commit: true, now_us: None, deadline_us: Some(43), memo: false }),
        ["1", "", "43"]
    );
    let ok = [5, 2, 3, -2, 0, 0, 0, 9, 4, 0, 6, 7, 8, -2, 300, 0, 0, 1, -1, 0, 0];
    let Some(ScriptReply::Done { now_us, requests: reqs }) = parse_reply(&ok, &[2, 1, 0, 1]) else {
        panic!("not parsed");
    };
    assert_eq!(now_us, 5);
    assert_eq!(reqs.len(), 4);
    assert!(!reqs[0].0 && reqs[1].0 && reqs[2].0 && !reqs[3].0);
    assert_eq!(
        reqs[0].1[1],
        Outcome { admitted: false, remaining: 0, reset_us: 9, retry_after_us: Some(4), delay_us: 0, next_us: 6 }
    );
    assert_eq!(
        reqs[1].1[0],
        Outcome { admitted: true, remaining: 7, reset_us: 8, retry_after_us: None, delay_us: 300, next_us: 0 }
    );
    assert_eq!(reqs[3].1[0].retry_after_us, None);
    assert!(parse_reply(&ok, &[2, 1]).is_none()); // left over
    assert!(parse_reply(&ok, &[2, 1, 2]).is_none()); // short
    assert!(parse_reply(&[5, 0, 0, -3, 0, 0], &[1]).is_none());
    assert!(parse_reply(&[5, -1, 0, -2, 0, 0], &[1]).is_none());
    assert!(parse_reply(&[-5, 0, 0, -2, 0, 0], &[1]).is_none());
    assert!(parse_reply(&[5, 0, 0, -2, -1, 0], &[1]).is_none()); // negative delay
    assert!(parse_reply(&[5, 0, 0, 4, 1, 0], &[1]).is_none()); // a rejected line's delay
    assert!(parse_reply(&[5, 0, 0, -2, 0, -1], &[1]).is_none()); // negative next
    assert!(parse_reply(&[5, 0, 0, -2, 0], &[1]).is_none()); // four values
    assert!(parse_reply::<usize>(&[], &[]).is_none());
    assert_eq!(parse_reply::<usize>(&[7], &[]), Some(ScriptReply::Done { now_us: 7, requests: vec![] }));
    // Dry-run lines do not reject the request: only its enforced lines.
    let dry: [&[bool]; 4] = [&[true, false], &[false], &[], &[true]];
    let Some(ScriptReply::Done { requests: reqs, .. }) = parse_reply(&ok, &dry) else {
        panic!("not parsed");
    };
    assert!(!reqs[0].0 && reqs[1].0 && reqs[2].0 && reqs[3].0);
    let dry: [&[bool]; 4] = [&[true, true], &[true], &[], &[false]];
    let Some(ScriptReply::Done { requests: reqs, .. }) = parse_reply(&ok, &dry) else {
        panic!("not parsed");
    };
    assert!(reqs[0].0 && reqs[1].0 && reqs[2].0 && !reqs[3].0);
    let Some(ScriptReply::Done { now_us: 7, requests: reqs }) = parse_reply(&[7], &[0]) else {
        panic!("not parsed");
    };
    assert!(reqs.len() == 1 && reqs[0].0 && reqs[0].1.is_empty());
    // Late: {-1, now}, whatever the requests were; nothing else starts with -1.
    let late = Some(ScriptReply::Late { now_us: 9 });
    assert_eq!(parse_reply(&[-1, 9], &[2, 1]), late);
    assert_eq!(parse_reply::<usize>(&[-1, 9], &[]), late);
    assert_eq!(late.map(|r| r.now_us()), Some(9));
    assert!(parse_reply::<usize>(&[-1], &[]).is_none());
    assert!(parse_reply::<usize>(&[-1, -9], &[]).is_none());
    assert!(parse_reply(&[-1, 9, 0, -2, 0], &[1]).is_none());
    assert!(parse_reply::<usize>(&[-2, 9], &[]).is_none());
}

/// A batch is the same as its requests one call each, in order, at the same
/// time: a request sees the writes of the requests before it, a rejected
/// request charges none of its lines.
/// A library keeps the lines it parsed from call to call, a bounded few:
/// many distinct lines over many calls answer as `EVALSHA` does.
#[test]
fn function_keeps_few_parsed_lines() {
    let (f, e) = (Redis::with(Mode::Function), Redis::with(Mode::Eval));
    let k = keys(1);
    for i in 0..300u64 {
        let l = limit(Algorithm::Gcra, 1 + i % 150, 1_000_000, 1 + i % 7);
        let now = T0 + i * 1000;
        assert_eq!(
            f.run(&k, &[(l, 1 + i % 3)], now, true, true),
            e.run(&k, &[(l, 1 + i % 3)], now, true, true),
            "call {i}"
        );
    }
    assert_eq!(f.snapshot(), e.snapshot());
    // The library's text: a name of its own, and the script's body.
    let lib = function_library();
    let name = function_name();
    assert!(lib.starts_with(&format!("#!lua name={name}\n")));
    assert!(name.len() == 19 && name.starts_with("rl_"));
    assert!(LIMIT_SCRIPT.ends_with("\nreturn limit(KEYS, ARGV)\n"));
    assert!(!lib.contains("return limit(KEYS, ARGV)"));
}

#[test]
fn runs_of_one_line_requests() {
    let a = limit(Algorithm::Gcra, 10, 1_000_000, 3);
    let b = limit(Algorithm::Fixed, 100, 60_000_000, 4);
    let (sa, sa2, sb) = (spec(&a, 1), spec(&a, 2), spec(&b, 1));
    let one: &[(Limit, u64)] = &[(a, 1)];
    let two: &[(Limit, u64)] = &[(a, 1), (b, 1)];
    let other: &[(Limit, u64)] = &[(a, 2)];
    // Runs of two or more requests of the same one line; the others as before.
    let batch = [one, one, one, two, one, other, other, one];
    let args = script_args(batch.iter().copied(), Call { commit: true, ..Call::default() });
    let want = ["1", "", "", "-3", &sa, "2", &sa, &sb, &sa, "-2", &sa2, &sa];
    assert_eq!(args, want);
    // A run is evaluated as its requests one by one: the same outcomes and state.
    let k = keys(2);
    let bkeys: Vec<String> = batch.iter().flat_map(|r| k[..r.len()].to_vec()).collect();
    let r = Redis::new();
    let got = r.run_batch(&bkeys, &batch, T0, true, true);
    let s = Redis::new();
    let mut off = 0;
    for (i, req) in batch.iter().enumerate() {
        let n = req.len();
        assert_eq!(s.run(&bkeys[off..off + n], req, T0, true, true), got[i], "request {i}");
        off += n;
    }
    assert_eq!(r.snapshot(), s.snapshot());
    let admitted: Vec<bool> = got.iter().map(|o| o.0).collect();
    assert_eq!(admitted, [true, true, true, false, false, false, false, false]);
}

fn spec(l: &Limit, cost: u64) -> String {
    let mut s = String::new();
    rl_core::redis::write_spec(&mut s, &(*l, cost).into());
    s
}

#[test]
fn batch_is_requests_in_order() {
    let a = limit(Algorithm::Gcra, 10, 1_000_000, 3);
    let b = limit(Algorithm::SlidingLog, 1, 1_000_000, 2);
    let c = limit(Algorithm::Fixed, 100, 60_000_000, 4);
    let ka = keys(3);
    let (one, two): (Request, Request) = (&[(a, 1)], &[(b, 1), (c, 1)]);
    let batch = [one, two, one, two, two, one, one];
    let bkeys: Vec<String> = batch
        .iter()
        .flat_map(|r| if r.len() == 1 { vec![ka[0].clone()] } else { vec![ka[1].clone(), ka[2].clone()] })
        .collect();
    let r = Redis::new();
    let got = r.run_batch(&bkeys, &batch, T0, true, true);
    let admitted: Vec<bool> = got.iter().map(|o| o.0).collect();
    // `a` admits 3; `b` admits 2 (then rejects, so `c` is charged only twice:
    // it would still admit two more, as the rejected request reports).
    assert_eq!(admitted, [true, true, true, true, false, true, false]);
    assert_eq!(got[4].1[1].remaining, 2);
    assert_eq!(got[6].1[0].retry_after_us, Some(100_000));
    // The same, one call per request.
    let s = Redis::new();
    let mut off = 0;
    for (i, req) in batch.iter().enumerate() {
        let k = &bkeys[off..off + req.len()];
        off += req.len();
        assert_eq!(s.run(k, req, T0, true, true), got[i], "request {i}");
    }
    // Same state and TTLs, with each string key written once.
    assert_eq!(r.snapshot(), s.snapshot());
    let log_writes = 2 * 3; // LPUSH, LTRIM, PEXPIRE per admitted request
    assert_eq!(r.writes(), 2 + log_writes);
    assert_eq!(s.writes(), 3 + 2 + log_writes);

    // A key that changes algorithm within a batch (only by hand: keys name
    // their algorithm) reads and writes as if the requests came one by one.
    let g: &[(Limit, u64)] = &[(a, 1)];
    let l: &[(Limit, u64)] = &[(b, 1)];
    let batch = [g, l, g, l, g];
    let k = vec![ka[0].clone(); batch.len()];
    let r = Redis::new();
    let got = r.run_batch(&k, &batch, T0, true, true);
    let s = Redis::new();
    for (i, req) in batch.iter().enumerate() {
        assert_eq!(s.run(&k[..1], req, T0, true, true), got[i], "request {i}");
    }
    assert_eq!(r.snapshot(), s.snapshot());
}

/// The issue's example on the script: rate=10r/s burst=5 queue=10, twenty
/// requests of one key in one call: 5 at once, 10 delayed by 100 ms steps,
/// 5 rejected; as the model says, for the three algorithms that queue.
#[test]
fn queue_of_twenty_requests() {
    for alg in [Algorithm::TokenBucket, Algorithm::LeakyBucket, Algorithm::Gcra] {
        let l = limit(alg, 10, 1_000_000, 5).with_queue(10).unwrap();
        let r = Redis::new();
        let k = keys(1);
        let one: &[(Limit, u64)] = &[(l, 1)];
        let keys20: Vec<String> = (0..20).map(|_| k[0].clone()).collect();
        let got = r.run_batch(&keys20, &[one; 20], T0, true, false);
        let delays: Vec<Option<u64>> = got.iter().map(|(a, o)| a.then_some(o[0].delay_us / 1000)).collect();
        let want: Vec<Option<u64>> =
            [0; 5].into_iter().chain((1..=10).map(|k| k * 100)).map(Some).chain([None; 5]).collect();
        assert_eq!(delays, want, "{alg}");
        let mut s = vec![vec![0; l.state_words()]];
        for (a, o) in &got {
            assert_eq!((*a, o.clone()), model(one, &mut s, T0, true), "{alg}");
        }
        assert_eq!(r.value(&k[0]), Some(stored(&l, &s[0])), "{alg}");
    }
}

/// Lines that share a key with different queues: the one with the smaller
/// queue reads what the larger one queued, as the model does on one state.
#[test]
fn queues_share_a_key() {
    for alg in [Algorithm::TokenBucket, Algorithm::LeakyBucket, Algorithm::Gcra] {
        let big = limit(alg, 10, 1_000_000, 5).with_queue(10).unwrap();
        let small = big.with_queue(2).unwrap();
        let none = big.with_queue(0).unwrap();
        let r = Redis::new();
        let k = keys(1);
        let mut s = vec![vec![0; big.state_words()]];
        let steps = [(big, 0), (big, 0), (big, 0), (big, 0), (big, 0), (big, 0), (big, 0), (big, 0)]
            .into_iter()
            .chain([(small, 0), (none, 0), (small, 50_000), (big, 60_000), (small, 900_000), (none, 1_100_000)]);
        let mut admitted = Vec::new();
        for (l, dt) in steps {
            let lines = [(l, 1)];
            let got = r.run(&k, &lines, T0 + dt, true, false);
            assert_eq!(got, model(&lines, &mut s, T0 + dt, true), "{alg} queue {} at +{dt}", l.queue());
            admitted.push(got.0);
        }
        // 8 queued by the big line: the small one (5 + 2) and the one without
        // a queue reject until enough has drained.
        assert_eq!(
            admitted,
            [true, true, true, true, true, true, true, true, false, false, false, true, true, true],
            "{alg}"
        );
    }
}

/// Dry-run lines beside an enforced one, in one call: a dry-run line that
/// would reject neither rejects the request nor is charged; one that would
/// admit is charged with the request; an enforced rejection charges none.
#[test]
fn dry_run_lines() {
    let strict = limit(Algorithm::Gcra, 1, 1_000_000, 1);
    let loose = limit(Algorithm::Fixed, 10, 1_000_000, 10);
    let r = Redis::new();
    let k = keys(2);
    let mut s = vec![vec![0; 2], vec![0; 1]];
    let lines = [(loose, 1, false), (strict, 1, true)];
    let mut seen = Vec::new();
    for i in 0..12 {
        let got = r.run(&k, &lines, T0 + i, true, false);
        assert_eq!(got, model(&lines, &mut s, T0 + i, true), "request {i}");
        seen.push((got.0, got.1[0].admitted, got.1[1].admitted));
    }
    // The first passes both; then the dry-run line would reject, yet the
    // request passes until the enforced line's ten are spent.
    assert_eq!(seen[0], (true, true, true));
    assert!(seen[1..10].iter().all(|&x| x == (true, true, false)), "{seen:?}");
    assert_eq!(seen[10], (false, false, false));
    // The strict line was charged once: its state is one interval.
    assert_eq!(s[1], [T0 + 1_000_000]);
}

/// The issue's sequence through the script: `burst=100` token_bucket at 100
/// per second, each response costs 30. Requests 1-4 pass the
/// `charge=after` line's check and are each charged 30 after the response
/// (the 4th takes the state to 120 used); the 5th is rejected with a
/// retry-after of 210 ms (21 units to repay) that, waited, admits it.
#[test]
fn charge_after_issue_sequence() {
    let l = limit(Algorithm::TokenBucket, 100, 1_000_000, 100);
    let check = [LineArg { check_only: true, ..LineArg::from((l, 1)) }];
    let mut p = Pair::new(&check);
    for i in 1..=4 {
        let (admitted, out) = p.step(&check, T0, true, false);
        assert!(admitted, "request {i}");
        // (not charged: what the state has left)
        assert_eq!(out[0].remaining, 100 - 30 * (i - 1), "request {i}");
        assert_eq!(p.charge(&[(l, 30)], T0, false), [true]);
    }
    assert_eq!(p.redis.value(&p.keys[0]), Some(format!("{} {T0}", 120 * 1_000_000)));
    // The key lives until the overdraft is repaid (1.2 s) + the margin.
    let exp = p.redis.expiry(&p.keys[0]).unwrap();
    assert!(exp >= T0 + 1_200_000 + TTL_MARGIN_MS * 1000, "{exp}");
    let (admitted, out) = p.step(&check, T0, true, false);
    assert!(!admitted);
    assert_eq!((out[0].remaining, out[0].reset_us, out[0].retry_after_us), (0, 1_200_000, Some(210_000)));
    assert!(!p.step(&check, T0 + 209_999, true, false).0);
    assert!(p.step(&check, T0 + 210_000, true, false).0);
    // The checks were never charged: the state holds the charges alone.
    assert_eq!(p.redis.value(&p.keys[0]), Some(format!("{} {T0}", 120 * 1_000_000)));
}

/// A `charge=after` line's check takes a cost of 1 whatever its cost, and
/// is never charged, alone or beside a line that is (it reports what its
/// state has left); flag 16 (not this script's) fails closed.
#[test]
fn charge_after_check_is_never_charged() {
    let l = case_limit(Algorithm::Gcra);
    let after = LineArg { check_only: true, ..LineArg::from((l, 7)) };
    let enforced = LineArg::from((l, 1));
    let mut p = Pair::new(&[after, enforced]);
    for _ in 0..3 {
        let (admitted, out) = p.step(&[after, enforced], T0, true, false);
        assert!(admitted);
        assert_eq!(out[0].remaining, 3);
    }
    assert_eq!(p.redis.value(&p.keys[0]), None);
    let mut s = String::new();
    write_spec(&mut s, &after);
    assert_eq!(s, "gcra 2 1000000 3 7 0 4");
    s.clear();
    write_spec(&mut s, &LineArg { dry_run: true, ..after });
    assert_eq!(s, "gcra 2 1000000 3 7 0 5");
    let r = Redis::new();
    r.set_now(T0);
    let reply = r.eval(&keys(1), &["1".into(), String::new(), String::new(), "gcra 2 1000000 3 1 0 16".into()]);
    assert_eq!(reply, [T0 as i64, 0, 0, -1, 0, 0]);
}

/// The charge call refuses, writing nothing for it: a malformed line,
/// `sliding_log`, a limit out of the exact range, a cost of 2^52 or more,
/// a charge that would take the state beyond 2^52; it charges the lines
/// beside them; a cost of 0 charges nothing.
#[test]
fn charge_refuses_what_it_cannot_hold_exactly() {
    let r = Redis::new();
    let k = keys(2);
    let fixed = limit(Algorithm::Fixed, 10, 1_000_000, 10);
    let bucket = limit(Algorithm::TokenBucket, 10, 1_000_000, 10);
    let log = limit(Algorithm::SlidingLog, 10, 1_000_000, 10);
    let wide = limit(Algorithm::TokenBucket, 1, 1 << 40, 1 << 13);
    assert!(!exact(&wide));
    for (line, cost) in [(log, 1), (wide, 1), (fixed, MAX_EXACT), (bucket, MAX_EXACT / 1_000_000 + 1), (fixed, 0)] {
        assert_eq!(r.charge(&k[..1], &[(line, cost)], T0, false), [cost == 0], "{line:?} {cost}");
    }
    assert_eq!(r.writes(), 0);
    // Up to 2^52 is taken, and the other line charged beside a refusal.
    let lines = [(fixed, MAX_EXACT - 1), (bucket, MAX_EXACT)];
    assert_eq!(r.charge(&k, &lines, T0, false), [true, false]);
    assert_eq!(r.value(&k[0]), Some(format!("{} {}", T0 / 1_000_000 + 1, MAX_EXACT - 1)));
    assert_eq!(r.value(&k[1]), None);
    assert_eq!(r.charge(&k[..1], &[(fixed, 1)], T0, false), [true]);
    assert_eq!(r.charge(&k[..1], &[(fixed, 1)], T0, false), [false]);
    // Malformed lines: refused; a wrong number of arguments: an error.
    let reply = r.eval_charge(&k, &[T0.to_string(), "fixed 10 1000000 10 x 0 0".into(), "nope".into()]);
    assert_eq!(reply, [T0 as i64, 0, 0]);
    let err = r.call_charge_table(&k, &[T0.to_string()]);
    assert!(err.raw_get::<mlua::Value>("err").unwrap().is_string());
}

/// The Rust side of the charge call: its arguments, names and reply.
#[test]
fn charge_rust_interface() {
    let l = limit(Algorithm::TokenBucket, 10, 60_000_000, 20);
    let g = limit(Algorithm::Gcra, 1, 1_000_000, 1).with_queue(2).unwrap();
    assert_eq!(
        charge_args([(l, 30), (g, 0)], None),
        ["", "token_bucket 10 60000000 20 30 0 0", "gcra 1 1000000 1 0 2 0"]
    );
    assert_eq!(charge_args([(l, 1)], Some(7)), ["7", "token_bucket 10 60000000 20 1 0 0"]);
    assert_eq!(charge_function_name(), format!("{}_charge", function_name()));
    assert!(charge_script().ends_with("return charge(KEYS, ARGV)\n"));
    assert!(function_library().contains(&format!("redis.register_function('{}', charge)", charge_function_name())));
    assert_eq!(parse_charge_reply(&[5, 1, 0], 2), Some(ChargeReply { now_us: 5, charged: vec![true, false] }));
    assert_eq!(parse_charge_reply(&[5, 1], 2), None);
    assert_eq!(parse_charge_reply(&[5, 2], 1), None);
    assert_eq!(parse_charge_reply(&[-5, 1], 1), None);
    assert_eq!(parse_charge_reply(&[], 0), None);
}

/// A varying line's flags: 2, or 3 when dry-run too; its state ends with
/// its tag, and a line with another scale converts it as rl-core does.
#[test]
fn varying_lines() {
    let slow = limit(Algorithm::Gcra, 1, 1_000_000, 5).varying();
    let fast = limit(Algorithm::Gcra, 10, 1_000_000, 5).varying();
    assert_eq!(spec(&slow, 1), "gcra 1 1000000 5 1 0 2");
    let mut s = String::new();
    rl_core::redis::write_spec(&mut s, &(fast, 2, true).into());
    assert_eq!(s, "gcra 10 1000000 5 2 0 3");
    let mut p = Pair::new(&[(slow, 1)]);
    for _ in 0..3 {
        assert!(p.step(&[(slow, 1)], T0, true, false).1[0].admitted);
    }
    assert_eq!(p.redis.value(&p.keys[0]).unwrap(), format!("{} 1000000", T0 + 3_000_000));
    // 3 requests at 1r/s are 3 at 10r/s: 2 left.
    let (_, out) = p.step(&[(fast, 1)], T0, true, false);
    assert_eq!(out[0].remaining, 1);
    assert_eq!(p.redis.value(&p.keys[0]).unwrap(), format!("{} 100000", T0 + 400_000));
    assert!(p.step(&[(fast, 1)], T0, true, false).1[0].admitted);
    assert!(!p.step(&[(fast, 1)], T0, true, false).1[0].admitted);
    // A dry-run varying line admits the request, charged iff it admits.
    let (admitted, out) = p.step(&[(fast, 1, true)], T0, true, false);
    assert!(admitted && !out[0].admitted);
}

/// A varying bucket drains at the rate that charged it: a slower line reads
/// what that rate has left, and from the writer's reset on reads it as
/// fresh, before its key expires as after. Its tag packs the rate.
#[test]
fn varying_bucket_drains_at_its_writers_rate() {
    let fast = limit(Algorithm::TokenBucket, 1, 1_000_000, 5).varying();
    let slow = limit(Algorithm::TokenBucket, 1, 60_000_000, 5).varying();
    let mut p = Pair::new(&[(fast, 1)]);
    for _ in 0..5 {
        assert!(p.step(&[(fast, 1)], T0, true, false).1[0].admitted);
    }
    // [used, last, tag]: 1r/s packs as 1. The key lives until the reset,
    // 5 s, and the margin and slack, 2 s.
    assert_eq!(p.redis.value(&p.keys[0]).unwrap(), format!("5000000 {T0} 1"));
    assert_eq!(p.redis.expiry(&p.keys[0]), Some(T0 + 7_000_000));
    // 3 s later at 1r/m: 2 used, as at 1r/s; 3 pass.
    let (_, out) = p.step(&[(slow, 1)], T0 + 3_000_000, false, false);
    assert_eq!((out[0].admitted, out[0].remaining, out[0].reset_us), (true, 2, 180_000_000));
    // At and after the reset: a fresh key's 4 left, before the key expires
    // as after.
    for now in [T0 + 5_000_000, T0 + 6_999_999, T0 + 7_000_000, T0 + 60_000_000] {
        let (_, out) = p.step(&[(slow, 1)], now, false, false);
        assert_eq!((out[0].admitted, out[0].remaining), (true, 4), "at T0 + {}", now - T0);
    }
    assert_eq!(p.redis.value(&p.keys[0]), None);
    // Charged, it converts: the 2 left of 5 at 1r/s and 1, at 1r/m; now;
    // 1r/m's tag (5).
    let now = T0 + 3_000_000;
    let mut p = Pair::new(&[(fast, 1)]);
    for _ in 0..5 {
        p.step(&[(fast, 1)], T0, true, false);
    }
    assert!(p.step(&[(slow, 1)], now, true, false).1[0].admitted);
    assert_eq!(p.redis.value(&p.keys[0]).unwrap(), format!("180000000 {now} 5"));
}
