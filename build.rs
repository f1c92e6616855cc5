//! Forwards what nginx-sys detected about the nginx being built against
//! (`ngx_feature`, `ngx_os` and version cfgs) to this crate, so code can be
//! conditional on the nginx version and its configure flags.

use std::env;

/// Version checks exported as `cfg(nginx1_NN_N)`.
const VERSION_CHECKS: &[(u64, &str)] = &[(1_021_001, "nginx1_21_1"), (1_025_001, "nginx1_25_1")];

fn main() {
    forward_list("DEP_NGINX_FEATURES", "ngx_feature");
    forward_list("DEP_NGINX_OS", "ngx_os");

    for (_, name) in VERSION_CHECKS {
        println!("cargo::rustc-check-cfg=cfg({name})");
    }
    println!("cargo::rerun-if-env-changed=DEP_NGINX_VERSION_NUMBER");
    if let Some(version) = env::var("DEP_NGINX_VERSION_NUMBER").ok().and_then(|v| v.parse::<u64>().ok()) {
        for (min, name) in VERSION_CHECKS {
            if version >= *min {
                println!("cargo::rustc-cfg={name}");
            }
        }
    }
    println!("cargo::rerun-if-env-changed=DEP_NGINX_BUILD_DIR");
    if let Ok(dir) = env::var("DEP_NGINX_BUILD_DIR") {
        println!("cargo::rustc-env=DEP_NGINX_BUILD_DIR={dir}");
    }
}

/// Declares `cfg(name, values(..))` from `{var}_CHECK` and sets the values in `var`.
fn forward_list(var: &str, name: &str) {
    println!("cargo::rerun-if-env-changed={var}_CHECK");
    let check = env::var(format!("{var}_CHECK")).unwrap_or_else(|_| "any()".into());
    println!("cargo::rustc-check-cfg=cfg({name}, values({check}))");
    println!("cargo::rerun-if-env-changed={var}");
    if let Ok(values) = env::var(var) {
        for v in values.split(',').map(str::trim).filter(|v| !v.is_empty()) {
            println!("cargo::rustc-cfg={name}=\"{v}\"");
        }
    }
}
