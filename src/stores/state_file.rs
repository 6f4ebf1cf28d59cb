//! Budgets across a restart (`STATE_FILE`, memory store only): the memory store written to a
//! file on shutdown and every `STATE_SAVE_INTERVAL_S`, and read back at start, before the
//! listeners accept.
//!
//! Only two methods of the store are used, [`MemoryStore::visit_states`] to save and
//! [`MemoryStore::restore`] to load, so the store's layout is its own business. Each limit of
//! a rule is a section of its own, and its clients are restored only when a rule of the same
//! **name** has a limit of the same **policy** (algorithm and numbers) now (a rule that gained
//! a daily quota keeps its burst limit's budgets); rule ids are positions in the table and
//! move when routes are added, so they are never matched. Every algorithm's state holds absolute times on the
//! store's clock (microseconds since the Unix epoch), so a restored state has the downtime
//! counted with no arithmetic here: a token bucket has refilled over it, a window that ended
//! is over. States whose budget is entirely back by the time they are read are not restored.
//!
//! A missing, truncated, corrupt or foreign file is logged and ignored: never a crash, never
//! a refusal to start (the worst it costs is what a restart without the file costs).
//!
//! # Format (version 1), integers little-endian
//!
//! ```text
//! magic "TOLLGATE" (8) | version u32 | body length u64 | CRC-32 (IEEE) of the body u32 | body
//! body:    saved at (µs since the epoch) u64 | key-hasher fingerprint [16] | section count u32
//!          | sections
//! section: one limit of one rule (a rule of several limits has several, of one name):
//!          name length u16 | name (UTF-8) | algorithm u8 | first number u64 | second u64
//!          | client count u64 | clients
//! client:  refused u8 (0, 1) | key: 0 ip | 1 header digest [16] | 2 ip and digest [16]
//!          (ip: 4 + 4 bytes | 6 + 16 bytes, then the prefix u8) | the algorithm's state
//! state:   token bucket: TAT u64 | fixed window: window u64, count u64 | sliding window:
//!          window u64, previous u64, current u64 | sliding log: length u32, times u64...
//! ```
//!
//! The whole file is read, its length and checksum checked before anything in it is believed,
//! then parsed, and only then restored: a file is restored whole or not at all. Every length
//! read from it is bounded by the bytes left (and names and logs by their own limits) before
//! anything is allocated, so a hostile file cannot make tollgate allocate more than its size.
//!
//! Header keys are digests under `KEY_HASH_SECRET` (or a random key per process without it):
//! the file records a fingerprint of the hasher, and header-keyed states saved under another
//! key are dropped, since they would name no client.

use std::collections::HashSet;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::algorithms::StateReader;
use crate::algorithms::{Policy, State};
use crate::rules::key::Digest;
use crate::rules::{ClientIp, ClientKey, Rule};
use crate::stores::MemoryStore;

/// The file's first bytes.
const MAGIC: [u8; 8] = *b"TOLLGATE";

/// The format written, and the only one read.
pub const FORMAT_VERSION: u32 = 1;

/// Magic, version, body length, checksum.
const ENVELOPE_LEN: usize = 8 + 4 + 8 + 4;

/// The longest rule name written and read: what its length field holds. Rule names are at
/// most 64 bytes, but RLS descriptors' limits are named by their descriptor path, whose depth
/// only the YAML's bounds limit; a rule with a longer name is not saved.
const MAX_NAME_LEN: usize = u16::MAX as usize;

/// The fewest bytes a rule's section takes (an empty name aside, which is refused): what
/// bounds the rule count a file declares.
const MIN_SECTION_LEN: usize = 2 + 1 + 8 + 8 + 8;

/// The fewest bytes a client takes (an IPv4 key and a token bucket's TAT): what bounds the
/// client count a section declares.
const MIN_CLIENT_LEN: usize = 1 + 1 + 1 + 4 + 1 + 8;

/// A clock this far behind the file's save time means the wall clock stepped back: its
/// absolute times would hold clients limited for the step too, so the file is ignored.
const CLOCK_BEHIND_TOLERANCE_US: u64 = 1_000_000;

/// `STATE_FILE` and `STATE_SAVE_INTERVAL_S`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StateFileSettings {
    /// `STATE_FILE`: where the store is saved; the temporary file goes beside it, in the same
    /// directory, so the rename that replaces it is atomic.
    pub path: PathBuf,
    /// `STATE_SAVE_INTERVAL_S`: how often it is saved while serving (besides on shutdown, so a
    /// crash or SIGKILL loses at most this much); `None` (0) saves only on shutdown.
    pub save_interval: Option<Duration>,
}

/// As `--check-config` shows it.
impl std::fmt::Display for StateFileSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} (read at start; saved ", self.path.display())?;
        match self.save_interval {
            Some(interval) => write!(f, "every {} s and on shutdown)", interval.as_secs()),
            None => write!(f, "on shutdown only)"),
        }
    }
}

/// Why a state file was not read, or not written.
#[derive(Debug, thiserror::Error)]
pub enum StateFileError {
    /// The file could not be read (other than being absent).
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: io::Error,
    },
    /// The file could not be written, or the directory is not writable.
    #[error("cannot write {path}: {source}")]
    Write {
        /// The file, or the temporary file beside it.
        path: PathBuf,
        /// Why.
        source: io::Error,
    },
    /// What the file holds is not a state file this tollgate can use.
    #[error("{path}: {problem}")]
    Invalid {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        problem: DecodeError,
    },
}

/// What is wrong with a file's bytes.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// It does not start with the magic: some other file.
    #[error("not a tollgate state file (it does not start with {:?})", std::str::from_utf8(&MAGIC).unwrap_or_default())]
    Foreign,
    /// A format this tollgate does not read.
    #[error("state file format version {found}; this tollgate reads version {FORMAT_VERSION}")]
    Version {
        /// The file's.
        found: u32,
    },
    /// Shorter (or longer) than it says: a write cut short.
    #[error("truncated: {declared} bytes of contents declared, {present} present")]
    Truncated {
        /// What the envelope says.
        declared: u64,
        /// What follows it.
        present: u64,
    },
    /// The contents do not match their checksum.
    #[error("checksum mismatch (stored {stored:08x}, contents give {computed:08x}): the file is corrupt")]
    Checksum {
        /// The envelope's.
        stored: u32,
        /// The contents'.
        computed: u32,
    },
    /// Checked, yet not what tollgate writes.
    #[error("corrupt at byte {offset} of the contents: {problem}")]
    Corrupt {
        /// Where, from the start of the body.
        offset: usize,
        /// What.
        problem: &'static str,
    },
    /// Saved later than now by the clock: the wall clock stepped back since.
    #[error("saved {ahead_s} s later than now by this clock (it stepped back?): its times cannot be trusted")]
    FromTheFuture {
        /// By how much, in whole seconds.
        ahead_s: u64,
    },
}

/// What a save wrote.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Saved {
    /// Client states written.
    pub clients: u64,
    /// The file's size.
    pub bytes: u64,
    /// From the first shard visited to the directory's fsync.
    pub duration: Duration,
}

/// One saved rule's fate at load.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuleReport {
    /// The saved rule's name.
    pub name: String,
    /// Clients restored (0 when dropped).
    pub restored: u64,
    /// Clients not restored: the whole rule when dropped; else those whose budget was back
    /// already, or whose header key was digested under another key.
    pub dropped: u64,
    /// Why the rule's clients were dropped; `None` when they were restored.
    pub dropped_because: Option<String>,
}

/// What a load did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Loaded {
    /// One entry per rule in the file, in its order.
    pub rules: Vec<RuleReport>,
    /// Seconds between the save and the load (the downtime counted).
    pub age: Duration,
    /// Header-keyed states dropped because `KEY_HASH_SECRET` is unset or changed.
    pub foreign_header_keys: u64,
    /// How long reading, checking and restoring took.
    pub duration: Duration,
    /// The file's size.
    pub bytes: u64,
}

impl Loaded {
    /// Clients restored, all rules together.
    pub fn restored(&self) -> u64 {
        self.rules.iter().map(|rule| rule.restored).sum()
    }
}

// --- encoding

fn put_u64(out: &mut Vec<u8>, value: u64) {
    out.extend_from_slice(&value.to_le_bytes());
}

fn put_ip(out: &mut Vec<u8>, ip: &ClientIp) {
    match ip.addr() {
        IpAddr::V4(v4) => {
            out.push(4);
            out.extend_from_slice(&v4.octets());
        }
        IpAddr::V6(v6) => {
            out.push(6);
            out.extend_from_slice(&v6.octets());
        }
    }
    out.push(ip.prefix());
}

/// Append one client; false (nothing written) for a state of another algorithm than the
/// rule's, which a decision would treat as a client never seen, and for a state its algorithm
/// never saves (a concurrency limit's leases: they belong to requests of the process that
/// saved them, which are over by the time the file is read).
fn put_client(out: &mut Vec<u8>, policy: &Policy, key: &ClientKey, state: &State, refused: bool) -> bool {
    let start = out.len();
    out.push(u8::from(refused));
    match key {
        ClientKey::Ip(ip) => {
            out.push(0);
            put_ip(out, ip);
        }
        ClientKey::Header(digest) => {
            out.push(1);
            out.extend_from_slice(&digest.to_bytes());
        }
        ClientKey::IpAndHeader(ip, digest) => {
            out.push(2);
            put_ip(out, ip);
            out.extend_from_slice(&digest.to_bytes());
        }
    }
    // The algorithm's own encoding (`Algorithm::save_state`).
    if !policy.save_state(state, out) {
        out.truncate(start);
        return false;
    }
    true
}

/// The whole file for `store`'s states under `rules` (the table the store was built for,
/// `rules[i].id == i`), header keys digested by the hasher of `fingerprint`. Shard locks are
/// held one at a time, each only while its clients are copied out.
pub fn encode(store: &MemoryStore, rules: &[Rule], fingerprint: [u8; 16]) -> (Vec<u8>, u64) {
    encode_at(store, rules, fingerprint, || store.now_us())
}

/// [`encode`], the save's time read from `now` once every state has been copied out.
fn encode_at(
    store: &MemoryStore,
    rules: &[Rule],
    fingerprint: [u8; 16],
    now: impl FnOnce() -> u64,
) -> (Vec<u8>, u64) {
    // A section per limit of each rule: the rule's name, the limit, its clients.
    let limits: Vec<(&Rule, &Policy)> = rules
        .iter()
        .flat_map(|rule| rule.limits.iter().map(move |policy| (rule, policy)))
        .collect();
    // Where each rule's first section is.
    let firsts: Vec<usize> = rules
        .iter()
        .scan(0, |next, rule| {
            let first = *next;
            *next += rule.limits.len();
            Some(first)
        })
        .collect();
    let mut sections: Vec<(u64, Vec<u8>)> = limits.iter().map(|_| (0, Vec::new())).collect();
    store.visit_states(|rule, limit, key, state, refused| {
        let Some(section) = firsts
            .get(usize::from(rule))
            .map(|first| first + limit)
            .filter(|_| rules[usize::from(rule)].limits.len() > limit)
        else {
            return;
        };
        if let (Some((_, policy)), Some((count, out))) = (limits.get(section), sections.get_mut(section))
            && put_client(out, policy, key, state, refused)
        {
            *count += 1;
        }
    });
    // After the visit: every state copied was decided at or before this time.
    let saved_at = now();
    let clients = limits
        .iter()
        .zip(&sections)
        .filter(|((rule, _), _)| (1..=MAX_NAME_LEN).contains(&rule.name.len()))
        .map(|(_, (count, _))| count)
        .sum();
    let size = ENVELOPE_LEN
        + 8
        + 16
        + 4
        + limits
            .iter()
            .zip(&sections)
            .map(|((rule, _), (_, out))| MIN_SECTION_LEN + rule.name.len() + out.len())
            .sum::<usize>();
    let mut file = Vec::with_capacity(size);
    file.extend_from_slice(&MAGIC);
    file.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
    // Length and checksum, written once the body is.
    file.extend_from_slice(&[0; 12]);
    put_u64(&mut file, saved_at);
    file.extend_from_slice(&fingerprint);
    let saved = || {
        limits
            .iter()
            .zip(&sections)
            .filter(|((rule, _), _)| (1..=MAX_NAME_LEN).contains(&rule.name.len()))
    };
    file.extend_from_slice(&(saved().count() as u32).to_le_bytes());
    for ((rule, policy), (count, out)) in saved() {
        let name = rule.name.as_bytes();
        file.extend_from_slice(&(name.len() as u16).to_le_bytes());
        file.extend_from_slice(name);
        let [first, second] = policy.script().1;
        file.push(policy.file_tag());
        put_u64(&mut file, first);
        put_u64(&mut file, second);
        put_u64(&mut file, *count);
        file.extend_from_slice(out);
    }
    let body_len = (file.len() - ENVELOPE_LEN) as u64;
    let checksum = crc32fast::hash(&file[ENVELOPE_LEN..]);
    file[12..20].copy_from_slice(&body_len.to_le_bytes());
    file[20..24].copy_from_slice(&checksum.to_le_bytes());
    (file, clients)
}

// --- decoding

/// Reads the body, every read checked against what is left.
struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn corrupt(&self, problem: &'static str) -> DecodeError {
        DecodeError::Corrupt {
            offset: self.at,
            problem,
        }
    }

    fn left(&self) -> usize {
        self.bytes.len() - self.at
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        if n > self.left() {
            return Err(self.corrupt("ends in the middle of a value"));
        }
        let taken = &self.bytes[self.at..self.at + n];
        self.at += n;
        Ok(taken)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], DecodeError> {
        let mut array = [0; N];
        array.copy_from_slice(self.take(N)?);
        Ok(array)
    }

    fn u8(&mut self) -> Result<u8, DecodeError> {
        Ok(self.array::<1>()?[0])
    }

    fn u16(&mut self) -> Result<u16, DecodeError> {
        self.array().map(u16::from_le_bytes)
    }

    fn u32(&mut self) -> Result<u32, DecodeError> {
        self.array().map(u32::from_le_bytes)
    }

    fn u64(&mut self) -> Result<u64, DecodeError> {
        self.array().map(u64::from_le_bytes)
    }

    fn ip(&mut self) -> Result<ClientIp, DecodeError> {
        let addr = match self.u8()? {
            4 => IpAddr::V4(Ipv4Addr::from(self.array::<4>()?)),
            6 => IpAddr::V6(Ipv6Addr::from(self.array::<16>()?)),
            _ => return Err(self.corrupt("an address family other than 4 or 6")),
        };
        let prefix = self.u8()?;
        let ip = ClientIp::new(addr, prefix);
        // What ClientIp::new makes of it is what was saved, or it was not made by it.
        if ip.addr() != addr || ip.prefix() != prefix {
            return Err(self.corrupt("an address with host bits past its prefix"));
        }
        Ok(ip)
    }

    /// One client under `policy`, its state checked against what the algorithm can leave
    /// by `saved_at` (give or take the clock's tolerated step back: a state restored from a
    /// file saved up to that much "later" is saved again as it was).
    fn client(&mut self, policy: &Policy, saved_at: u64) -> Result<(ClientKey, State, bool), DecodeError> {
        let saved_at = saved_at.saturating_add(CLOCK_BEHIND_TOLERANCE_US);
        let refused = match self.u8()? {
            0 => false,
            1 => true,
            _ => return Err(self.corrupt("a refused flag other than 0 or 1")),
        };
        let key = match self.u8()? {
            0 => ClientKey::Ip(self.ip()?),
            1 => ClientKey::Header(Digest::from_bytes(self.array()?)),
            2 => ClientKey::IpAndHeader(self.ip()?, Digest::from_bytes(self.array()?)),
            _ => return Err(self.corrupt("an unknown kind of client key")),
        };
        // The algorithm's own decoding (`Algorithm::load_state`), from where the key ended.
        let mut input = StateReader::new(self.bytes, self.at);
        let state = policy.load_state(&mut input, saved_at);
        self.at = input.at();
        let state = state.map_err(|problem| self.corrupt(problem))?;
        Ok((key, state, refused))
    }
}

/// A rule's section, parsed and checked; its clients are read again from `clients` to be
/// restored.
struct Section<'a> {
    name: &'a str,
    policy: Policy,
    count: u64,
    clients: &'a [u8],
}

/// A checked file's contents.
struct Contents<'a> {
    saved_at: u64,
    fingerprint: [u8; 16],
    sections: Vec<Section<'a>>,
}

/// Check the envelope (magic, version, length, checksum) and return the body.
fn open(file: &[u8]) -> Result<&[u8], DecodeError> {
    if file.len() < MAGIC.len() || file[..MAGIC.len()] != MAGIC {
        // A prefix of the magic is a file cut short, not another program's.
        if file.len() < MAGIC.len() && MAGIC.starts_with(file) {
            return Err(DecodeError::Truncated {
                declared: ENVELOPE_LEN as u64,
                present: file.len() as u64,
            });
        }
        return Err(DecodeError::Foreign);
    }
    if file.len() < ENVELOPE_LEN {
        return Err(DecodeError::Truncated {
            declared: ENVELOPE_LEN as u64,
            present: file.len() as u64,
        });
    }
    let mut envelope = Reader {
        bytes: &file[..ENVELOPE_LEN],
        at: MAGIC.len(),
    };
    let version = envelope.u32()?;
    if version != FORMAT_VERSION {
        return Err(DecodeError::Version { found: version });
    }
    let (declared, stored) = (envelope.u64()?, envelope.u32()?);
    let body = &file[ENVELOPE_LEN..];
    if declared != body.len() as u64 {
        return Err(DecodeError::Truncated {
            declared,
            present: body.len() as u64,
        });
    }
    let computed = crc32fast::hash(body);
    if computed != stored {
        return Err(DecodeError::Checksum { stored, computed });
    }
    Ok(body)
}

/// Parse and check a whole file, allocating no more than its size.
fn decode(file: &[u8]) -> Result<Contents<'_>, DecodeError> {
    let mut reader = Reader {
        bytes: open(file)?,
        at: 0,
    };
    let saved_at = reader.u64()?;
    let fingerprint = reader.array()?;
    let section_count = reader.u32()? as usize;
    if section_count > reader.left() / MIN_SECTION_LEN {
        return Err(reader.corrupt("more rules declared than the file can hold"));
    }
    let mut sections = Vec::with_capacity(section_count);
    let mut names = HashSet::with_capacity(section_count);
    for _ in 0..section_count {
        let len = usize::from(reader.u16()?);
        if len == 0 {
            return Err(reader.corrupt("an empty rule name"));
        }
        let name =
            std::str::from_utf8(reader.take(len)?).map_err(|_| reader.corrupt("a rule name not UTF-8"))?;
        let (code, first, second) = (reader.u8()?, reader.u64()?, reader.u64()?);
        if !names.insert((name, code, first, second)) {
            return Err(reader.corrupt("a limit of a rule saved twice"));
        }
        let policy =
            Policy::from_file(code, [first, second]).ok_or_else(|| reader.corrupt("an unknown algorithm"))?;
        let count = reader.u64()?;
        if count > (reader.left() / MIN_CLIENT_LEN) as u64 {
            return Err(reader.corrupt("more clients declared than the file can hold"));
        }
        let start = reader.at;
        for _ in 0..count {
            reader.client(&policy, saved_at)?;
        }
        sections.push(Section {
            name,
            policy,
            count,
            clients: &reader.bytes[start..reader.at],
        });
    }
    if reader.left() != 0 {
        return Err(reader.corrupt("bytes after the last rule"));
    }
    Ok(Contents {
        saved_at,
        fingerprint,
        sections,
    })
}

/// Restore into `store` the clients of `file` whose rule has the same name and policy among
/// `rules` (the table the store was built for) and whose budget is not back by `now_us`;
/// header keys only if `fingerprint` is the saver's. All or nothing: a file that does not
/// check restores nothing.
pub fn restore_from(
    file: &[u8],
    store: &MemoryStore,
    rules: &[Rule],
    fingerprint: [u8; 16],
    now_us: u64,
) -> Result<Loaded, DecodeError> {
    let started = Instant::now();
    let contents = decode(file)?;
    if contents.saved_at > now_us.saturating_add(CLOCK_BEHIND_TOLERANCE_US) {
        return Err(DecodeError::FromTheFuture {
            ahead_s: (contents.saved_at - now_us) / 1_000_000,
        });
    }
    let same_hasher = contents.fingerprint == fingerprint;
    let mut loaded = Loaded {
        rules: Vec::with_capacity(contents.sections.len()),
        age: Duration::from_micros(now_us.saturating_sub(contents.saved_at)),
        foreign_header_keys: 0,
        duration: Duration::ZERO,
        bytes: file.len() as u64,
    };
    for section in &contents.sections {
        let mut report = RuleReport {
            name: section.name.to_owned(),
            restored: 0,
            dropped: 0,
            dropped_because: None,
        };
        let rule = rules.iter().find(|rule| &*rule.name == section.name);
        let limit = rule.and_then(|rule| rule.limits.iter().position(|policy| *policy == section.policy));
        match (rule, limit) {
            (None, _) => {
                report.dropped = section.count;
                report.dropped_because = Some("no rule of this name now".into());
            }
            (Some(rule), None) => {
                report.dropped = section.count;
                report.dropped_because = Some(format!(
                    "its limits changed (saved {}, now {})",
                    section.policy, rule.limits
                ));
            }
            (Some(rule), Some(limit)) => {
                let mut reader = Reader {
                    bytes: section.clients,
                    at: 0,
                };
                for _ in 0..section.count {
                    let (key, state, refused) = reader.client(&section.policy, contents.saved_at)?;
                    let header_keyed = !matches!(key, ClientKey::Ip(_));
                    if header_keyed && !same_hasher {
                        loaded.foreign_header_keys += 1;
                        report.dropped += 1;
                    } else if section.policy.is_idle(&state, now_us) {
                        report.dropped += 1;
                    } else if store.restore(rule.id, limit, key, state, refused) {
                        report.restored += 1;
                    } else {
                        report.dropped += 1;
                    }
                }
            }
        }
        loaded.rules.push(report);
    }
    loaded.duration = started.elapsed();
    Ok(loaded)
}

// --- the file

/// The temporary file a save writes before renaming it over `path`: beside it, so the rename
/// stays within one file system and is atomic.
fn temporary(path: &Path) -> PathBuf {
    let name = path
        .file_name()
        .map_or_else(|| "state".into(), |name| name.to_string_lossy());
    path.with_file_name(format!(".{name}.tmp-{}", std::process::id()))
}

/// The directory `path` is in (`.` for a bare file name).
fn directory(path: &Path) -> &Path {
    match path.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent,
        _ => Path::new("."),
    }
}

/// Write `bytes` to `path` so that a crash at any point leaves either the old file or the new
/// one: a temporary file beside it, fsync, rename over `path`, fsync of the directory (so the
/// rename itself is on disk).
pub fn write_atomically(path: &Path, bytes: &[u8]) -> Result<(), StateFileError> {
    let temporary = temporary(path);
    let written = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(&temporary)
        .and_then(|mut file| {
            file.write_all(bytes)?;
            file.sync_all()
        })
        .and_then(|()| fs::rename(&temporary, path));
    if let Err(source) = written {
        let _ = fs::remove_file(&temporary);
        return Err(StateFileError::Write {
            path: temporary,
            source,
        });
    }
    let directory = directory(path);
    File::open(directory)
        .and_then(|directory| directory.sync_all())
        .map_err(|source| StateFileError::Write {
            path: directory.to_owned(),
            source,
        })
}

/// Whether a save to `path` can work: its directory exists and takes a new file (created and
/// removed), and `path` is not a directory. Run at startup, so a mistyped or read-only path
/// is found when it is deployed, not at the first restart that should have kept the budgets.
pub fn check_writable(path: &Path) -> Result<(), StateFileError> {
    if path.is_dir() {
        return Err(StateFileError::Write {
            path: path.to_owned(),
            source: io::Error::new(
                io::ErrorKind::IsADirectory,
                "STATE_FILE names a directory, not a file",
            ),
        });
    }
    let probe = temporary(path);
    OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(&probe)
        .map_err(|source| StateFileError::Write {
            path: probe.clone(),
            source,
        })?;
    let _ = fs::remove_file(&probe);
    Ok(())
}

/// Save `store` to `path` (blocking: call it off the runtime's workers).
pub fn save(
    path: &Path,
    store: &MemoryStore,
    rules: &[Rule],
    fingerprint: [u8; 16],
) -> Result<Saved, StateFileError> {
    let started = Instant::now();
    let (file, clients) = encode(store, rules, fingerprint);
    write_atomically(path, &file)?;
    Ok(Saved {
        clients,
        bytes: file.len() as u64,
        duration: started.elapsed(),
    })
}

/// Read `path` into `store` (blocking). `Ok(None)` when there is no file.
pub fn load(
    path: &Path,
    store: &MemoryStore,
    rules: &[Rule],
    fingerprint: [u8; 16],
) -> Result<Option<Loaded>, StateFileError> {
    let started = Instant::now();
    let file = match fs::read(path) {
        Ok(file) => file,
        Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(source) => {
            return Err(StateFileError::Read {
                path: path.to_owned(),
                source,
            });
        }
    };
    let mut loaded = restore_from(&file, store, rules, fingerprint, store.now_us()).map_err(|problem| {
        StateFileError::Invalid {
            path: path.to_owned(),
            problem,
        }
    })?;
    loaded.duration = started.elapsed();
    Ok(Some(loaded))
}

// --- the wiring

/// The store's saver: what the server runs to load at start, save every interval, and save
/// once more after the drain. Built from the store and the rules it was built for; a reload
/// hands it the next table's ([`Persistence::follow`]).
#[derive(Clone)]
pub struct Persistence {
    settings: StateFileSettings,
    /// The store and its table's rules (names and policies, with the ids the store files
    /// states under): the table in force.
    source: Arc<parking_lot::Mutex<(MemoryStore, Arc<[Rule]>)>>,
    fingerprint: [u8; 16],
    /// One save at a time: a periodic save still running (a blocking task cannot be aborted)
    /// finishes before the last one starts, so the last file written is the last save.
    saving: Arc<parking_lot::Mutex<()>>,
    /// What the metrics show of the saves.
    stats: Arc<SaveStats>,
}

/// The saves so far, for the metrics.
#[derive(Debug, Default)]
pub struct SaveStats {
    /// Saves that wrote the file.
    pub ok: std::sync::atomic::AtomicU64,
    /// Saves that failed.
    pub failed: std::sync::atomic::AtomicU64,
    /// The last good save's duration, in microseconds.
    pub last_duration_us: std::sync::atomic::AtomicU64,
    /// The last good save's size, in bytes.
    pub last_bytes: std::sync::atomic::AtomicU64,
    /// Client states in the last good save.
    pub last_clients: std::sync::atomic::AtomicU64,
}

impl Persistence {
    /// The saver of `store`, whose table's rules are `rules`, header keys digested by the
    /// hasher of `fingerprint` ([`KeyHasher::fingerprint`](crate::rules::KeyHasher::fingerprint)).
    pub fn new(
        settings: StateFileSettings,
        store: MemoryStore,
        rules: &[Rule],
        fingerprint: [u8; 16],
    ) -> Persistence {
        Persistence {
            settings,
            source: Arc::new(parking_lot::Mutex::new((store, rules.into()))),
            fingerprint,
            saving: Arc::default(),
            stats: Arc::default(),
        }
    }

    /// Count the saves into `stats` (the metrics' own) rather than a record of its own.
    pub fn with_stats(self, stats: Arc<SaveStats>) -> Persistence {
        Persistence { stats, ..self }
    }

    /// Save `store`, the view of the store of a reloaded table of `rules`, from now on.
    pub fn follow(&self, store: MemoryStore, rules: &[Rule]) {
        *self.source.lock() = (store, rules.into());
    }

    /// What the saves did so far.
    pub fn stats(&self) -> Arc<SaveStats> {
        self.stats.clone()
    }

    /// Read the file into the store and log what was restored and what dropped. Never fails:
    /// a file that cannot be used is logged and ignored.
    pub async fn load(&self) {
        let this = self.clone();
        let path = self.settings.path.clone();
        let loaded = tokio::task::spawn_blocking(move || {
            let (store, rules) = this.source.lock().clone();
            load(&this.settings.path, &store, &rules, this.fingerprint)
        })
        .await;
        match loaded {
            Ok(Ok(None)) => {
                tracing::info!(path = %path.display(), "no state file yet: every budget starts full")
            }
            Ok(Ok(Some(loaded))) => log_loaded(&path, &loaded),
            Ok(Err(error)) => tracing::warn!(%error, "state file ignored: every budget starts full"),
            Err(error) => tracing::error!(%error, "loading the state file failed: every budget starts full"),
        }
    }

    /// Save now, off the runtime's workers; logs a failure (the file left is the last good one).
    pub async fn save(&self) -> Option<Saved> {
        let this = self.clone();
        let saved = tokio::task::spawn_blocking(move || {
            let _one_at_a_time = this.saving.lock();
            let (store, rules) = this.source.lock().clone();
            save(&this.settings.path, &store, &rules, this.fingerprint)
        })
        .await;
        use std::sync::atomic::Ordering::Relaxed;
        match saved {
            Ok(Ok(saved)) => {
                self.stats.ok.fetch_add(1, Relaxed);
                self.stats
                    .last_duration_us
                    .store(saved.duration.as_micros() as u64, Relaxed);
                self.stats.last_bytes.store(saved.bytes, Relaxed);
                self.stats.last_clients.store(saved.clients, Relaxed);
                tracing::debug!(
                    path = %self.settings.path.display(),
                    clients = saved.clients,
                    bytes = saved.bytes,
                    duration_ms = saved.duration.as_millis() as u64,
                    "state file saved"
                );
                Some(saved)
            }
            Ok(Err(error)) => {
                self.stats.failed.fetch_add(1, Relaxed);
                tracing::warn!(%error, "state file not saved (the previous one, if any, is left as it was)");
                None
            }
            Err(error) => {
                self.stats.failed.fetch_add(1, Relaxed);
                tracing::error!(%error, "saving the state file failed");
                None
            }
        }
    }

    /// Save every `STATE_SAVE_INTERVAL_S` until aborted (never, when it is 0); the first save
    /// comes one interval after the call.
    pub async fn save_periodically(self) {
        let Some(interval) = self.settings.save_interval else {
            return std::future::pending().await;
        };
        let mut tick = tokio::time::interval(interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tick.tick().await;
        loop {
            tick.tick().await;
            self.save().await;
        }
    }

    /// Save on shutdown, logging what was written.
    pub async fn save_on_shutdown(&self) {
        if let Some(saved) = self.save().await {
            tracing::info!(
                path = %self.settings.path.display(),
                clients = saved.clients,
                bytes = saved.bytes,
                duration_ms = saved.duration.as_millis() as u64,
                "state file saved on shutdown"
            );
        }
    }
}

/// One line of what was restored, one per rule dropped.
fn log_loaded(path: &Path, loaded: &Loaded) {
    let restored: Vec<String> = loaded
        .rules
        .iter()
        .filter(|rule| rule.dropped_because.is_none())
        .map(|rule| format!("{} ({} clients)", rule.name, rule.restored))
        .collect();
    tracing::info!(
        path = %path.display(),
        clients = loaded.restored(),
        age_s = loaded.age.as_secs(),
        bytes = loaded.bytes,
        duration_ms = loaded.duration.as_millis() as u64,
        rules = %restored.join(", "),
        "state file restored"
    );
    for rule in &loaded.rules {
        if let Some(because) = &rule.dropped_because {
            tracing::info!(rule = %rule.name, clients = rule.dropped, "state file: rule dropped: {because}");
        }
    }
    if loaded.foreign_header_keys > 0 {
        tracing::warn!(
            clients = loaded.foreign_header_keys,
            "state file: header-keyed budgets dropped: they were digested under another KEY_HASH_SECRET \
             (or a random one: set KEY_HASH_SECRET for header keys to survive a restart)"
        );
    }
}

#[cfg(test)]
mod tests;
