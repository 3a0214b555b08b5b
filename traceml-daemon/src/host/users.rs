//! User names and uids through the system's name service switch (`getpwuid_r`/`getpwnam_r`, so
//! whatever `/etc/nsswitch.conf` names: files, LDAP, SSSD, systemd's dynamic users), never a
//! parse of `/etc/passwd`: on a GPU node the users of jobs usually come from a directory.
//!
//! A lookup may be slow (a directory server over the network), so answers are cached for
//! [`TTL`] (a user renamed or added is seen within a minute), a miss for [`MISS_TTL`].
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long an answer is kept.
pub const TTL: Duration = Duration::from_secs(60);
/// How long "no such user" is kept (a directory that did not answer may answer soon).
pub const MISS_TTL: Duration = Duration::from_secs(10);

struct Cache {
    names: HashMap<u32, (Option<String>, Instant)>,
    uids: HashMap<String, (Option<u32>, Instant)>,
}

static CACHE: Mutex<Option<Cache>> = Mutex::new(None);

fn fresh<T>(entry: &(Option<T>, Instant), now: Instant) -> bool {
    let ttl = if entry.0.is_some() { TTL } else { MISS_TTL };
    now.duration_since(entry.1) < ttl
}

/// The name of user `uid`, if the name service knows one.
pub fn name_of(uid: u32) -> Option<String> {
    let now = Instant::now();
    {
        let guard = CACHE.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(e) = guard.as_ref().and_then(|c| c.names.get(&uid))
            && fresh(e, now)
        {
            return e.0.clone();
        }
    }
    // Looked up outside the lock: a slow directory stalls only this caller.
    let name = uzers::get_user_by_uid(uid).map(|u| u.name().to_string_lossy().into_owned());
    let mut guard = CACHE.lock().unwrap_or_else(|p| p.into_inner());
    let cache = guard.get_or_insert_with(|| Cache {
        names: HashMap::new(),
        uids: HashMap::new(),
    });
    cache.names.insert(uid, (name.clone(), now));
    name
}

/// The uid of the user called `name`, if the name service knows one.
pub fn uid_of(name: &str) -> Option<u32> {
    let now = Instant::now();
    {
        let guard = CACHE.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(e) = guard.as_ref().and_then(|c| c.uids.get(name))
            && fresh(e, now)
        {
            return e.0;
        }
    }
    let uid = uzers::get_user_by_name(name).map(|u| u.uid());
    let mut guard = CACHE.lock().unwrap_or_else(|p| p.into_inner());
    let cache = guard.get_or_insert_with(|| Cache {
        names: HashMap::new(),
        uids: HashMap::new(),
    });
    cache.uids.insert(name.to_owned(), (uid, now));
    uid
}

#[cfg(test)]
mod tests {
    use super::*;

    /// root is uid 0 wherever the name service reads /etc/passwd ("files" is everywhere).
    #[test]
    fn root_both_ways_and_a_miss() {
        assert_eq!(name_of(0).as_deref(), Some("root"));
        assert_eq!(uid_of("root"), Some(0));
        assert_eq!(uid_of("no-such-user-traceml"), None);
        // Cached: the same answer again.
        assert_eq!(uid_of("no-such-user-traceml"), None);
        assert_eq!(name_of(0).as_deref(), Some("root"));
    }
}
