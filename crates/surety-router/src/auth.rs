//! The operator's sessions: a session is a random token in a cookie, never
//! a credential. The router keeps, per session, only the sha256 of its
//! token, the key it was opened with (by the key's sha256, so a key taken
//! out of the configuration ends its sessions), the session's own CSRF
//! token and its expiry. Signing out forgets it; so does its expiry. Tokens
//! and CSRF tokens are compared in constant time.
//!
//! Sessions live in this router's memory: with several replicas, an
//! operator stays on one (sticky sessions) or signs in on each.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

/// The most sessions open at once; past it the oldest is forgotten.
const MAX_SESSIONS: usize = 10_000;

/// One open session.
#[derive(Debug, Clone)]
pub struct Session {
    /// The sha256 (hex) of the API key it was opened with.
    pub key_hash: String,
    /// The token every form that changes something must carry.
    pub csrf: String,
    opened: Instant,
    expires: Instant,
}

impl Session {
    /// Whether `token` is this session's CSRF token (constant time).
    pub fn csrf_matches(&self, token: &str) -> bool {
        same_token(&self.csrf, token)
    }
}

/// Whether two secrets (tokens, key digests) are equal, compared in
/// constant time.
pub fn same_token(a: &str, b: &str) -> bool {
    bool::from(a.as_bytes().ct_eq(b.as_bytes()))
}

#[derive(Debug)]
pub struct Sessions {
    ttl: Duration,
    open: Mutex<HashMap<[u8; 32], Session>>,
}

/// 32 random bytes, hex.
pub fn random_token() -> String {
    hex::encode(rand::random::<[u8; 32]>())
}

fn digest(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}

impl Sessions {
    pub fn new(ttl: Duration) -> Sessions {
        Sessions {
            ttl,
            open: Mutex::default(),
        }
    }

    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    fn open(&self) -> std::sync::MutexGuard<'_, HashMap<[u8; 32], Session>> {
        self.open
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Opens a session for the key whose sha256 is `key_hash`; its token
    /// (for the cookie) is returned and kept only as its digest.
    pub fn start(&self, key_hash: &str) -> String {
        let token = random_token();
        let now = Instant::now();
        let mut open = self.open();
        open.retain(|_, s| s.expires > now);
        if open.len() >= MAX_SESSIONS
            && let Some(oldest) = open.iter().min_by_key(|(_, s)| s.opened).map(|(k, _)| *k)
        {
            open.remove(&oldest);
        }
        open.insert(
            digest(&token),
            Session {
                key_hash: key_hash.to_owned(),
                csrf: random_token(),
                opened: now,
                expires: now + self.ttl,
            },
        );
        token
    }

    /// The session `token` names, if it is open and has not expired. (The
    /// map is keyed by the token's digest, so no token is compared with
    /// another byte by byte.)
    pub fn get(&self, token: &str) -> Option<Session> {
        let mut open = self.open();
        let key = digest(token);
        match open.get(&key) {
            Some(s) if s.expires > Instant::now() => Some(s.clone()),
            Some(_) => {
                open.remove(&key);
                None
            }
            None => None,
        }
    }

    /// Ends the session `token` names.
    pub fn end(&self, token: &str) {
        self.open().remove(&digest(token));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_session_is_found_by_its_token_until_it_ends_or_expires() {
        let sessions = Sessions::new(Duration::from_secs(60));
        let token = sessions.start("abc");
        let found = sessions.get(&token).map(|s| s.key_hash);
        assert_eq!(found.as_deref(), Some("abc"));
        assert!(sessions.get("not-a-token").is_none());
        sessions.end(&token);
        assert!(sessions.get(&token).is_none());
        let expired = Sessions::new(Duration::ZERO);
        let token = expired.start("abc");
        assert!(expired.get(&token).is_none());
    }
}

/// Failed authentications (an unknown API key, a refused sign-in) per
/// client address: past the limit (`max_failed_auth`) in a `FAILURE_WINDOW`, that address is refused
/// before its key is even looked at, until the window ends, so keys cannot
/// be guessed at the speed of the network.
#[derive(Debug)]
pub struct Failures {
    /// How many an address may make in a window; `None`: no limit.
    limit: Option<u32>,
    /// Read-locked on every authenticated request, write-locked on a failure.
    by_peer: std::sync::RwLock<HashMap<std::net::IpAddr, (u32, Instant)>>,
}

/// The window failed authentications are counted in.
pub const FAILURE_WINDOW: Duration = Duration::from_secs(10);
/// The most addresses tracked at once; past it the oldest window goes.
const MAX_PEERS: usize = 100_000;

impl Failures {
    pub fn new(limit: Option<u32>) -> Failures {
        Failures {
            limit,
            by_peer: std::sync::RwLock::default(),
        }
    }

    pub fn limit(&self) -> Option<u32> {
        self.limit
    }

    /// How long `peer` must wait before it may try again, if it is over the limit.
    pub fn blocked(&self, peer: std::net::IpAddr) -> Option<Duration> {
        let limit = self.limit?;
        let now = Instant::now();
        let by_peer = self
            .by_peer
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        match by_peer.get(&peer) {
            Some((n, since)) if *n >= limit && now < *since + FAILURE_WINDOW => {
                Some(*since + FAILURE_WINDOW - now)
            }
            _ => None,
        }
    }

    /// Counts one failed authentication from `peer`.
    pub fn failed(&self, peer: std::net::IpAddr) {
        if self.limit.is_none() {
            return;
        }
        let now = Instant::now();
        let mut by_peer = self
            .by_peer
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if by_peer.len() >= MAX_PEERS {
            by_peer.retain(|_, (_, since)| now < *since + FAILURE_WINDOW);
        }
        let entry = by_peer.entry(peer).or_insert((0, now));
        if now >= entry.1 + FAILURE_WINDOW {
            *entry = (0, now);
        }
        entry.0 += 1;
    }
}
