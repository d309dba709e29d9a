//! guest-init's kernel command line parser: the launch request (mvm.cmd,
//! mvm.workdir), the agent switch, the shares and the root disk, and every
//! value decoder they use. Besides panics, hangs and runaway allocations:
//! a command line built from what was parsed parses to the same thing.

#![no_main]

use libfuzzer_sys::fuzz_target;
use mvm_guest_init::cmdline;
use mvm_protocol::boot::{encode_hex, MountParam, RootParam};

fuzz_target!(|data: &[u8]| {
    let line = String::from_utf8_lossy(data);
    let _ = cmdline::agent_requested(&line);
    let _ = cmdline::shares(&line);
    let _ = cmdline::root(&line);
    for word in line.split_whitespace() {
        let value = word.split_once('=').map_or(word, |(_, v)| v);
        let _ = cmdline::decode_argv(value);
        let _ = cmdline::decode_share(value);
        if let Ok(mount) = MountParam::decode(value) {
            let again = mount.to_param();
            let (_, v) = again.split_once('=').expect("name=value");
            assert_eq!(MountParam::decode(v).as_ref(), Ok(&mount), "{again}");
        }
        if let Ok(root) = RootParam::decode(value) {
            let again = root.to_param();
            let (_, v) = again.split_once('=').expect("name=value");
            assert_eq!(RootParam::decode(v), Ok(root), "{again}");
        }
    }
    if let Ok(launch) = cmdline::parse(&line) {
        if launch.interactive {
            return;
        }
        // The same launch, as the VMM would write it.
        let joined = launch
            .argv
            .iter()
            .map(|a| a.as_bytes())
            .collect::<Vec<_>>()
            .join(&0u8);
        let again = format!(
            "mvm.cmd={} mvm.workdir={}",
            encode_hex(&joined),
            encode_hex(launch.workdir.as_bytes())
        );
        let reparsed = cmdline::parse(&again).expect("a command line the VMM writes parses");
        assert_eq!(reparsed, launch, "{again}");
    }
});
