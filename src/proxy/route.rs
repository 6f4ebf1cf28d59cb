//! Which rule a request path falls under.
//!
//! Paths are compared after normalisation, because the backend will likely treat several
//! spellings of a path as the same route and a limiter that disagrees can be walked around.
//! The normal form is: percent-decoded, ASCII-lowercased, `.` and `..` segments resolved,
//! repeated slashes collapsed and the trailing slash dropped. So `/login`, `/Login`,
//! `//login`, `/login/`, `/a/../login` and `/log%69n` are all the auth path `/login`. When in
//! doubt this errs toward the stricter rule: treating a harmless path as auth costs little,
//! letting a login route escape its budget is the thing a limiter exists to prevent. The path
//! forwarded to the backend is never rewritten.

use std::fmt;

use percent_encoding::percent_decode_str;

/// One entry of `AUTH_PATHS`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PathPattern {
    /// `/login`: that path only (in normal form).
    Exact(String),
    /// `/auth/*`: `/auth` and everything below it.
    Subtree(String),
    /// `/auth*`: every normal path starting with `/auth` (`/authorize` too).
    Prefix(String),
}

impl PathPattern {
    /// Parse one entry; it must start with `/`, and `*` may only end it.
    pub fn parse(entry: &str) -> Result<Self, String> {
        if !entry.starts_with('/') {
            return Err("each path must start with '/'".into());
        }
        match entry.find('*') {
            None => Ok(PathPattern::Exact(normalize(entry))),
            Some(star) if star == entry.len() - 1 => {
                let base = &entry[..star];
                Ok(if base.ends_with('/') {
                    PathPattern::Subtree(normalize(base))
                } else {
                    PathPattern::Prefix(normalize(base))
                })
            }
            Some(_) => Err("'*' is only allowed at the end of a path".into()),
        }
    }

    /// Does the normalised `path` match?
    pub fn matches(&self, path: &str) -> bool {
        match self {
            PathPattern::Exact(exact) => path == exact,
            PathPattern::Subtree(base) => {
                base == "/"
                    || path
                        .strip_prefix(base.as_str())
                        .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
            }
            PathPattern::Prefix(base) => path.starts_with(base.as_str()),
        }
    }
}

impl fmt::Display for PathPattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PathPattern::Exact(path) => f.write_str(path),
            PathPattern::Subtree(base) if base == "/" => f.write_str("/*"),
            PathPattern::Subtree(base) => write!(f, "{base}/*"),
            PathPattern::Prefix(base) => write!(f, "{base}*"),
        }
    }
}

/// `AUTH_PATHS`: the paths that draw from the auth budget.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AuthPaths(pub Vec<PathPattern>);

impl AuthPaths {
    /// Is this request path (raw, as received, without the query) an auth path?
    pub fn matches(&self, raw_path: &str) -> bool {
        if self.0.is_empty() {
            return false;
        }
        if is_normal(raw_path) {
            // The common case needs no allocation.
            return self.0.iter().any(|pattern| pattern.matches(raw_path));
        }
        let path = normalize(raw_path);
        self.0.iter().any(|pattern| pattern.matches(&path))
    }
}

impl fmt::Display for AuthPaths {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, pattern) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{pattern}")?;
        }
        Ok(())
    }
}

/// True when `normalize(path) == path`: a conservative, allocation-free check.
fn is_normal(path: &str) -> bool {
    let bytes = path.as_bytes();
    bytes.first() == Some(&b'/')
        && (bytes.len() == 1 || bytes.last() != Some(&b'/'))
        && !bytes
            .iter()
            .any(|b| matches!(b, b'%' | b'A'..=b'Z') || !b.is_ascii())
        && !path.contains("//")
        && !path.split('/').any(|segment| segment == "." || segment == "..")
}

/// The normal form of a path, as described in the module docs.
pub fn normalize(raw_path: &str) -> String {
    let decoded = percent_decode_str(raw_path).decode_utf8_lossy();
    let mut segments: Vec<&str> = Vec::new();
    for segment in decoded.split('/') {
        match segment {
            "" | "." => {}
            ".." => {
                segments.pop();
            }
            segment => segments.push(segment),
        }
    }
    let mut path = String::with_capacity(decoded.len() + 1);
    for segment in &segments {
        path.push('/');
        path.push_str(segment);
    }
    if path.is_empty() {
        path.push('/');
    }
    path.make_ascii_lowercase();
    path
}

#[cfg(test)]
mod tests {
    use super::*;

    fn auth(list: &[&str]) -> AuthPaths {
        AuthPaths(list.iter().map(|p| PathPattern::parse(p).unwrap()).collect())
    }

    #[test]
    fn spellings_of_one_path_are_one_path() {
        let paths = auth(&["/login"]);
        for spelling in [
            "/login",
            "/Login",
            "/LOGIN",
            "//login",
            "/login/",
            "/./login",
            "/x/../login",
            "/log%69n",
            "/login%2F",
        ] {
            assert!(paths.matches(spelling), "{spelling} should be the auth path");
        }
        for other in ["/logins", "/login/x", "/", "/api/login", "/log"] {
            assert!(!paths.matches(other), "{other} should not be the auth path");
        }
    }

    #[test]
    fn a_trailing_star_is_a_prefix() {
        let paths = auth(&["/auth/*", "/oauth*"]);
        assert!(paths.matches("/auth"));
        assert!(paths.matches("/auth/token"));
        assert!(paths.matches("/AUTH//token/"));
        assert!(!paths.matches("/authx"));
        assert!(paths.matches("/oauth"));
        assert!(paths.matches("/oauth2/authorize"));
        assert!(!paths.matches("/oaut"));
        assert!(auth(&["/*"]).matches("/anything"));
    }

    #[test]
    fn bad_patterns_say_why() {
        assert!(PathPattern::parse("login").is_err());
        assert!(PathPattern::parse("/a*b").is_err());
        assert_eq!(
            auth(&["/Login/", "/auth/*", "/o*"]).to_string(),
            "/login,/auth/*,/o*"
        );
    }

    #[test]
    fn the_fast_path_agrees_with_normalize() {
        for path in [
            "/", "/a", "/a/b", "/a/", "//a", "/A", "/a/./b", "/a/../b", "/%61", "/é", "/a.b", "/..a", "",
        ] {
            // Conservative: whatever it calls normal is normal.
            assert!(!is_normal(path) || normalize(path) == path, "{path:?}");
        }
        for path in ["/", "/login", "/api/v1/users", "/a.b", "/..a"] {
            assert!(is_normal(path), "{path:?} should take the fast path");
        }
    }

    #[test]
    fn normal_form() {
        assert_eq!(normalize(""), "/");
        assert_eq!(normalize("/../.."), "/");
        assert_eq!(normalize("/a//b/./c/../"), "/a/b");
        assert_eq!(normalize("/%ZZ"), "/%zz");
    }
}
