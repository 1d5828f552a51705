//! `subloop doctor`: what this machine can enforce of `run_main`'s sandbox.

use subloop::tools::sandbox::Sandbox;
use subloop::tools::sandbox::Support;

/// The report, for `support` (what [`Support::probe`] found).
pub fn report(support: &Support) -> String {
    let mut text = format!(
        "{} on {} {}{}\n",
        super::version(),
        std::env::consts::OS,
        std::env::consts::ARCH,
        kernel()
            .map(|release| format!(", kernel {release}"))
            .unwrap_or_default()
    );
    let landlock = match support.landlock_abi {
        Some(abi) => format!(
            "ABI {abi} (the sandbox needs {})",
            Support::NEEDED_LANDLOCK_ABI
        ),
        None => "not available".to_owned(),
    };
    text.push_str(&format!("Landlock: {landlock}\n"));
    let yes = |on: bool| if on { "yes" } else { "no" };
    text.push_str(&format!("seccomp filters: {}\n", yes(support.seccomp)));
    let namespaces = match &support.namespaces {
        Ok(mode) => (*mode).to_owned(),
        Err(missing) => format!("not available: {missing}"),
    };
    text.push_str(&format!("namespaces: {namespaces}\n"));
    text.push_str("run_main's sandbox (--sandbox):\n");
    for level in Sandbox::ALL {
        let default = if level == Sandbox::default() {
            " (the default)"
        } else {
            ""
        };
        let state = match support.missing(level) {
            None if level.confines() => "enforced".to_owned(),
            None => "no sandbox: the program runs with your rights and environment".to_owned(),
            Some(missing) => format!(
                "cannot be enforced: {missing}; run_main refuses to start programs at this level"
            ),
        };
        text.push_str(&format!("  {:<16} {state}{default}\n", level.name()));
    }
    text.trim_end().to_owned()
}

/// The kernel's release (`uname -r`).
fn kernel() -> Option<String> {
    // SAFETY: uname(2) fills a struct we own.
    let mut name: libc::utsname = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    if unsafe { libc::uname(&mut name) } != 0 {
        return None;
    }
    let release: Vec<u8> = name
        .release
        .iter()
        .take_while(|c| **c != 0)
        .map(|c| *c as u8)
        .collect();
    String::from_utf8(release).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_report_names_every_level() {
        let text = report(&Support::probe());
        assert!(text.starts_with("subloop "), "{text}");
        for level in Sandbox::ALL {
            assert!(text.contains(&format!("  {}", level.name())), "{text}");
        }
        assert!(text.contains("Landlock: "), "{text}");
    }
}
