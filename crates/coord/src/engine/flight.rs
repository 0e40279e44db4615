//! The flight recorder: what each thread is evaluating now, in a file that
//! outlives the process, so that a coordinator killed by an evaluation
//! (SIGABRT: a stack overflow, a panic while panicking) knows at its next
//! start what killed it, and fails that one thing instead of evaluating it
//! again: no crash loop, whatever thread the evaluation died on.
//!
//! The file lives in the coordinator's state directory ([`StateDir`]),
//! where only the coordinator's own user can write: it is opened without
//! following a symbolic link, must be a regular file of that user, and is
//! locked, so that two coordinators never share one.
//!
//! Layout: byte 0 is the crash mark (written by the SIGABRT handler), byte 1
//! the layout's version, bytes 2 and 3 the slot of the thread that aborted
//! (little-endian; `0xFFFF`: a thread that was not evaluating); slot `i` is
//! [`SLOT_BYTES`] at `SLOT_BYTES * (i + 1)`, a [`Subject`] or zeros. Every
//! thread that evaluates takes a slot on its first evaluation and gives it
//! back when it ends. Only the aborting thread's subject is blamed: what
//! other threads were evaluating at that moment did not kill the process.

use std::cell::Cell;
use std::fs::{File, OpenOptions};
use std::io::Read;
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicI32, AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};

use uuid::Uuid;

/// What an evaluation is for: what a coordinator that dies during it blames.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Subject {
    /// An event applied to a run, or its end's failure handler's input.
    Run(Uuid),
    /// What a definition version evaluates when a run of it is created (its
    /// tags, concurrency and fairness keys) or an event meets its triggers.
    Definition(Uuid),
    /// A webhook's transform of a delivery.
    Webhook(String),
}

impl Subject {
    /// The subject's kind and key as stored in the quarantine.
    pub fn kind(&self) -> &'static str {
        match self {
            Subject::Run(_) => "run",
            Subject::Definition(_) => "definition",
            Subject::Webhook(_) => "webhook",
        }
    }

    pub fn key(&self) -> String {
        match self {
            Subject::Run(id) | Subject::Definition(id) => id.to_string(),
            Subject::Webhook(name) => name.clone(),
        }
    }

    /// The subject of a stored kind and key.
    pub fn of(kind: &str, key: &str) -> Option<Subject> {
        match kind {
            "run" => key.parse().ok().map(Subject::Run),
            "definition" => key.parse().ok().map(Subject::Definition),
            "webhook" => Some(Subject::Webhook(key.to_string())),
            _ => None,
        }
    }

    /// Its slot's bytes in the flight file.
    pub fn encode(&self) -> [u8; SLOT_BYTES] {
        let mut slot = [0u8; SLOT_BYTES];
        let (tag, bytes): (u8, &[u8]) = match self {
            Subject::Run(id) => (1, id.as_bytes()),
            Subject::Definition(id) => (2, id.as_bytes()),
            Subject::Webhook(name) => (3, name.as_bytes()),
        };
        let len = bytes.len().min(SLOT_BYTES - 2);
        slot[0] = tag;
        slot[1] = len as u8;
        slot[2..2 + len].copy_from_slice(&bytes[..len]);
        slot
    }

    fn decode(slot: &[u8]) -> Option<Subject> {
        let (&tag, rest) = slot.split_first()?;
        let (&len, rest) = rest.split_first()?;
        let bytes = rest.get(..len as usize)?;
        match tag {
            1 => Uuid::from_slice(bytes).ok().map(Subject::Run),
            2 => Uuid::from_slice(bytes).ok().map(Subject::Definition),
            3 => std::str::from_utf8(bytes).ok().map(|n| Subject::Webhook(n.to_string())),
            _ => None,
        }
    }
}

impl std::fmt::Display for Subject {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}", self.kind(), self.key())
    }
}

/// Bytes of one slot: a tag, a length and up to 254 bytes of key (a
/// webhook's name has at most 128).
pub const SLOT_BYTES: usize = 256;

/// Slots in the file: every thread that evaluates at once (the pool's at
/// most 64, the async runtime's workers for simple expressions).
pub const SLOTS: usize = 256;

const CRASH_MARK: u8 = b'!';
const VERSION: u8 = 3;
/// The aborting thread held no slot.
const NO_SLOT: u16 = 0xFFFF;

/// The thread holding each slot (its `pthread_t`; 0: none), for the SIGABRT
/// handler to find the slot of the thread that aborts (a signal raised by
/// `abort()` is delivered to the thread that called it).
static HOLDERS: [AtomicU64; SLOTS] = [const { AtomicU64::new(0) }; SLOTS];

/// The first bytes of a flight file as the SIGABRT handler marks it when
/// the thread holding `slot` aborts.
pub fn crash_mark(slot: u16) -> [u8; 4] {
    let [lo, hi] = slot.to_le_bytes();
    [CRASH_MARK, VERSION, lo, hi]
}

fn this_thread() -> u64 {
    // SAFETY: pthread_self has no preconditions and reads no memory of ours.
    #[allow(unsafe_code)]
    let me = unsafe { libc::pthread_self() };
    me as u64
}

/// A coordinator's state directory (`COMPOSER_STATE_DIR`): created 0700
/// when missing; refused when another user owns it or others may write in
/// it, since whoever can write there can make the coordinator fail runs.
#[derive(Debug, Clone)]
pub struct StateDir(PathBuf);

impl StateDir {
    /// Opens (creating) the directory at `path`; the error says what is wrong.
    pub fn open(path: &Path) -> std::io::Result<StateDir> {
        use std::os::unix::fs::DirBuilderExt;
        match std::fs::symlink_metadata(path) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                std::fs::DirBuilder::new().recursive(true).mode(0o700).create(path)?;
            }
            Err(e) => return Err(e),
            Ok(_) => {}
        }
        let meta = std::fs::symlink_metadata(path)?;
        let refuse = |why: String| Err(std::io::Error::new(std::io::ErrorKind::PermissionDenied, why));
        if !meta.is_dir() {
            return refuse(format!("{} is not a directory (a symbolic link is not followed)", path.display()));
        }
        let me = current_uid();
        if meta.uid() != me {
            return refuse(format!(
                "{} belongs to user {}, not to this process's user {me}",
                path.display(),
                meta.uid()
            ));
        }
        if meta.permissions().mode() & 0o022 != 0 {
            return refuse(format!(
                "{} may be written by its group or others (mode {:o}); chmod 700 it",
                path.display(),
                meta.permissions().mode() & 0o777
            ));
        }
        Ok(StateDir(path.to_path_buf()))
    }

    pub fn path(&self) -> &Path {
        &self.0
    }

    /// The flight file of a coordinator listening on `listen`.
    pub fn flight_file(&self, listen: &str) -> PathBuf {
        let name: String = listen.chars().map(|c| if c.is_ascii_alphanumeric() { c } else { '_' }).collect();
        self.0.join(format!("flight-{name}"))
    }
}

/// The default state directory: systemd's `$STATE_DIRECTORY`, else
/// `$XDG_STATE_HOME/composer`, else `~/.local/state/composer`.
pub fn default_state_dir() -> Option<PathBuf> {
    let var = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty()).map(PathBuf::from);
    if let Some(dir) = var("STATE_DIRECTORY") {
        // systemd may give several, colon-separated: the first is ours.
        let first = dir.to_string_lossy().split(':').next().unwrap_or_default().to_string();
        return Some(PathBuf::from(first));
    }
    var("XDG_STATE_HOME")
        .map(|d| d.join("composer"))
        .or_else(|| var("HOME").map(|h| h.join(".local").join("state").join("composer")))
}

fn current_uid() -> u32 {
    // SAFETY: getuid cannot fail and touches no memory of ours.
    #[allow(unsafe_code)]
    unsafe {
        libc::getuid()
    }
}

/// The open flight file.
pub struct Flight {
    file: File,
    free: Mutex<Vec<usize>>,
}

/// The flight file's descriptor, for the signal handler.
static FLIGHT_FD: AtomicI32 = AtomicI32::new(-1);

/// The process's flight recorder, once a coordinator opened one.
static RECORDER: OnceLock<Flight> = OnceLock::new();

thread_local! {
    /// This thread's slot, taken on its first evaluation and given back at
    /// its end ([`Slot`]'s drop).
    static SLOT: Slot = const { Slot(Cell::new(None)) };
}

struct Slot(Cell<Option<usize>>);

impl Drop for Slot {
    fn drop(&mut self) {
        if let (Some(slot), Some(flight)) = (self.0.get(), RECORDER.get()) {
            flight.write(slot, None);
            HOLDERS[slot].store(0, Ordering::SeqCst);
            flight.free.lock().expect("flight slots").push(slot);
        }
    }
}

impl Flight {
    /// Opens (creating) the flight file at `path` and locks it; the subject
    /// it names if the last process to use it crashed. The mark stays until
    /// [`Flight::clear_mark`] (once what it names is failed: a start that
    /// fails first finds it again); a slot's old subject is harmless, since
    /// only the aborting thread's slot is ever blamed.
    pub fn open(path: &Path) -> std::io::Result<(Flight, Vec<Subject>)> {
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(path)?;
        let meta = file.metadata()?;
        if !meta.is_file() || meta.uid() != current_uid() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::PermissionDenied,
                format!("{} is not a regular file of this process's user", path.display()),
            ));
        }
        lock(&file, path)?;
        let mut bytes = Vec::new();
        file.read_to_end(&mut bytes)?;
        let crashed = match (bytes.first(), bytes.get(1), bytes.get(2..4)) {
            (Some(&CRASH_MARK), Some(&VERSION), Some(at)) => {
                let at = u16::from_le_bytes([at[0], at[1]]);
                let slot = bytes.get(SLOT_BYTES * (at as usize + 1)..).and_then(|b| b.get(..SLOT_BYTES));
                match (at, slot.and_then(Subject::decode)) {
                    (NO_SLOT, _) | (_, None) => {
                        tracing::warn!("the last process to use {} aborted, not while evaluating", path.display());
                        Vec::new()
                    }
                    (_, Some(subject)) => vec![subject],
                }
            }
            _ => Vec::new(),
        };
        if bytes.get(1) != Some(&VERSION) || bytes.len() != SLOT_BYTES * (SLOTS + 1) {
            bytes = vec![0; SLOT_BYTES * (SLOTS + 1)];
            bytes[1..4].copy_from_slice(&crash_mark(NO_SLOT)[1..]);
            file.set_len(0)?;
        }
        // Every byte written, no hole left: a slot written later never needs
        // a new block, so a disk that fills does not stop the recorder (and
        // a disk already full is an error here, at start, naming the file).
        file.write_all_at(&bytes, 0)?;
        file.sync_all()?;
        Ok((Flight { file, free: Mutex::new((0..SLOTS).rev().collect()) }, crashed))
    }

    /// Takes the crash mark off: what it named has been failed.
    pub fn clear_mark(&self) -> std::io::Result<()> {
        self.file.write_all_at(&[0], 0)?;
        self.file.sync_data()
    }

    /// The process's recorder, once installed.
    pub fn installed() -> Option<&'static Flight> {
        RECORDER.get()
    }

    /// Makes this the process's recorder (a second one is dropped: several
    /// coordinators in one process, as in tests, share the first).
    pub fn install(self) {
        use std::os::fd::AsRawFd;
        let fd = self.file.as_raw_fd();
        if RECORDER.set(self).is_ok() {
            mark_on_abort(fd);
        }
    }

    fn write(&self, slot: usize, subject: Option<&Subject>) {
        let bytes = subject.map_or([0u8; SLOT_BYTES], Subject::encode);
        // Not synced: the page cache outlives the process, which is what
        // the recorder is for (a machine that dies takes the runs' locks
        // with it, and nothing was half-applied).
        if let Err(e) = self.file.write_all_at(&bytes, (SLOT_BYTES * (slot + 1)) as u64) {
            tracing::warn!(error = %e, "could not write the flight file");
        }
    }
}

/// Runs `f` with `subject` written in this thread's slot of the recorder
/// (when the process has one): a crash inside `f` blames `subject`.
pub fn recording<T>(subject: &Subject, f: impl FnOnce() -> T) -> T {
    let Some(flight) = RECORDER.get() else { return f() };
    let slot = SLOT.with(|s| {
        if s.0.get().is_none() {
            let taken = flight.free.lock().expect("flight slots").pop();
            if let Some(slot) = taken {
                HOLDERS[slot].store(this_thread(), Ordering::SeqCst);
            }
            s.0.set(taken);
        }
        s.0.get()
    });
    let Some(slot) = slot else {
        tracing::warn!("every slot of the flight file is taken: this evaluation is not recorded");
        return f();
    };
    struct Clear<'a>(&'a Flight, usize);
    impl Drop for Clear<'_> {
        fn drop(&mut self) {
            self.0.write(self.1, None);
        }
    }
    flight.write(slot, Some(subject));
    let _clear = Clear(flight, slot);
    f()
}

/// An exclusive lock on the flight file, so that two coordinators (two
/// processes on one listen address and state directory) never share it.
fn lock(file: &File, path: &Path) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    // SAFETY: flock on a descriptor we own; no memory is shared.
    #[allow(unsafe_code)]
    let locked = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    if locked != 0 {
        return Err(std::io::Error::new(
            std::io::ErrorKind::WouldBlock,
            format!("{} is in use by another coordinator", path.display()),
        ));
    }
    Ok(())
}

fn mark_on_abort(fd: i32) {
    FLIGHT_FD.store(fd, Ordering::SeqCst);
    extern "C" fn on_abort(_: libc::c_int) {
        let fd = FLIGHT_FD.load(Ordering::SeqCst);
        let me = this_thread();
        let at = HOLDERS.iter().position(|h| h.load(Ordering::SeqCst) == me).map_or(NO_SLOT, |i| i as u16);
        let mark = crash_mark(at);
        // SAFETY: pthread_self, pwrite, signal and raise are async-signal-safe
        // (as glibc implements the first: a read of the thread pointer); the
        // buffer outlives the call. The default action then ends the
        // process, as abort() (or a SIGABRT sent from outside) means it to.
        #[allow(unsafe_code)]
        unsafe {
            if fd >= 0 {
                libc::pwrite(fd, mark.as_ptr().cast(), mark.len(), 0);
            }
            libc::signal(libc::SIGABRT, libc::SIG_DFL);
            libc::raise(libc::SIGABRT);
        }
    }
    let handler = on_abort as extern "C" fn(libc::c_int);
    // SAFETY: installs a handler that only calls async-signal-safe functions.
    #[allow(unsafe_code)]
    unsafe {
        libc::signal(libc::SIGABRT, handler as libc::sighandler_t);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir() -> PathBuf {
        let d = std::env::temp_dir().join(format!("composer-state-test-{}", Uuid::now_v7()));
        StateDir::open(&d).unwrap();
        d
    }

    #[test]
    fn a_crash_mark_names_the_subjects_in_flight_once() {
        let d = dir();
        let path = d.join("flight");
        let (flight, crashed) = Flight::open(&path).unwrap();
        assert!(crashed.is_empty());
        let (a, b) = (Subject::Run(Uuid::now_v7()), Subject::Webhook("stripe".into()));
        flight.write(0, Some(&a));
        flight.write(3, Some(&b));
        flight.write(3, None);
        drop(flight);
        let (flight, crashed) = Flight::open(&path).unwrap();
        assert!(crashed.is_empty(), "no mark (a clean stop or a SIGKILL): nobody is blamed");

        let def = Subject::Definition(Uuid::now_v7());
        flight.write(5, Some(&a));
        flight.write(9, Some(&def));
        flight.write(200, Some(&b));
        flight.file.write_all_at(&crash_mark(9), 0).unwrap();
        drop(flight);
        let (flight, crashed) = Flight::open(&path).unwrap();
        assert_eq!(crashed, vec![def.clone()], "what the aborting thread was evaluating, not what the others were");
        drop(flight);
        let (flight, again) = Flight::open(&path).unwrap();
        assert_eq!(again, vec![def], "named again until what it names is failed");
        flight.clear_mark().unwrap();
        drop(flight);
        let (flight, again) = Flight::open(&path).unwrap();
        assert!(again.is_empty(), "blamed once");
        flight.write(5, Some(&a));
        flight.file.write_all_at(&crash_mark(NO_SLOT), 0).unwrap();
        drop(flight);
        let (_, crashed) = Flight::open(&path).unwrap();
        assert!(crashed.is_empty(), "an abort on a thread that was not evaluating blames nothing");
        std::fs::remove_dir_all(d).unwrap();
    }

    #[test]
    fn the_flight_file_has_every_block_it_will_write_from_the_start() {
        // A hole would need a new block when a slot is first written, which
        // a full disk refuses: the recorder would stop recording.
        let d = dir();
        let path = d.join("flight");
        for _ in 0..2 {
            let (flight, _) = Flight::open(&path).unwrap();
            let meta = flight.file.metadata().unwrap();
            assert_eq!(meta.len(), (SLOT_BYTES * (SLOTS + 1)) as u64);
            assert!(meta.blocks() * 512 >= meta.len(), "{} of {} bytes allocated", meta.blocks() * 512, meta.len());
        }
        std::fs::remove_dir_all(d).unwrap();
    }

    #[test]
    fn a_flight_file_in_use_a_symlink_or_a_loose_directory_is_refused() {
        let d = dir();
        let path = d.join("flight");
        let (held, _) = Flight::open(&path).unwrap();
        let e = Flight::open(&path).err().unwrap();
        assert!(e.to_string().contains("in use by another coordinator"), "{e}");
        drop(held);

        let target = d.join("victim");
        std::fs::write(&target, b"keep me").unwrap();
        let link = d.join("planted");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        assert!(Flight::open(&link).is_err(), "a symbolic link is not followed");
        assert_eq!(std::fs::read(&target).unwrap(), b"keep me", "nor written through");

        let loose = d.join("loose");
        std::fs::create_dir(&loose).unwrap();
        std::fs::set_permissions(&loose, std::fs::Permissions::from_mode(0o777)).unwrap();
        let e = StateDir::open(&loose).unwrap_err();
        assert!(e.to_string().contains("chmod 700"), "{e}");
        let e = StateDir::open(&link).unwrap_err();
        assert!(e.to_string().contains("not a directory"), "{e}");
        let made = StateDir::open(&d.join("new/deeper")).unwrap();
        let mode = std::fs::metadata(made.path()).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o700, "created for this user only");
        std::fs::remove_dir_all(d).unwrap();
    }

    #[test]
    fn a_webhook_name_of_any_allowed_length_fits_a_slot() {
        let long = Subject::Webhook("w".repeat(128));
        assert_eq!(Subject::decode(&long.encode()), Some(long));
        let run = Subject::Run(Uuid::now_v7());
        assert_eq!(Subject::decode(&run.encode()), Some(run.clone()));
        assert_eq!(Subject::of(run.kind(), &run.key()), Some(run));
        assert_eq!(Subject::decode(&[0u8; SLOT_BYTES]), None);
    }
}
