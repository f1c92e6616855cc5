//! Redis' `struct` library, ported to Rust for mlua: the script packs and
//! unpacks its string states with it, and `fake_redis.lua` decodes them.

use mlua::{Lua, Table};

/// Redis' `struct` library, the formats the script uses: `<` (little
/// endian), `B` (a byte), `d` (a double).
pub(crate) fn struct_lib(lua: &Lua) -> Table {
    fn items(fmt: &[u8]) -> impl Iterator<Item = u8> + '_ {
        assert_eq!(fmt.first(), Some(&b'<'), "struct: little endian only");
        fmt[1..].iter().map(|&c| {
            assert!(c == b'B' || c == b'd', "struct: format {}", c as char);
            c
        })
    }
    let t = lua.create_table().unwrap();
    let pack = lua
        .create_function(|lua, (fmt, args): (mlua::String, mlua::Variadic<f64>)| {
            let mut out = Vec::new();
            let mut args = args.iter();
            for c in items(&fmt.as_bytes()) {
                let x = *args.next().expect("struct.pack: too few arguments");
                match c {
                    b'B' => out.push(x as u8),
                    _ => out.extend_from_slice(&x.to_le_bytes()),
                }
            }
            lua.create_string(&out)
        })
        .unwrap();
    let unpack = lua
        .create_function(|_, (fmt, data, init): (mlua::String, mlua::String, Option<usize>)| {
            let data = data.as_bytes();
            let mut pos = init.unwrap_or(1) - 1;
            let mut out = Vec::new();
            for c in items(&fmt.as_bytes()) {
                let n = if c == b'B' { 1 } else { 8 };
                let b = data.get(pos..pos + n).expect("struct.unpack: data string too short");
                out.push(match c {
                    b'B' => f64::from(b[0]),
                    _ => f64::from_le_bytes(b.try_into().unwrap()),
                });
                pos += n;
            }
            out.push((pos + 1) as f64);
            Ok(mlua::Variadic::from_iter(out))
        })
        .unwrap();
    t.set("pack", pack).unwrap();
    t.set("unpack", unpack).unwrap();
    t
}
