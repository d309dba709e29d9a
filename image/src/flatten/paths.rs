//! Path hygiene for names in layer tarballs.

/// The components of a tar path with leading "/" and "./" and empty or
/// "." components dropped; None when a ".." component would climb out
/// (a hostile layer: no image needs one).
pub(crate) fn components(path: &[u8]) -> Option<Vec<&[u8]>> {
    let mut out = Vec::new();
    for c in path.split(|b| *b == b'/') {
        match c {
            b"" | b"." => {}
            b".." => return None,
            c => out.push(c),
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::components;

    #[test]
    fn strips_roots_and_refuses_dotdot() {
        assert_eq!(
            components(b"/./a//b/./c/").unwrap(),
            [&b"a"[..], b"b", b"c"]
        );
        assert_eq!(components(b"./").unwrap(), Vec::<&[u8]>::new());
        assert!(components(b"a/../b").is_none());
        assert!(components(b"../etc/passwd").is_none());
        assert_eq!(components(b"a/..b").unwrap(), [&b"a"[..], b"..b"]);
    }
}
