//! Events: the driver-log lines the mock follows and the events they become.

use super::*;

/// One parsed line of the event file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Line {
    /// `<uuid> <xid>`: an XID event.
    Xid(String, u64),
    /// `<uuid> dbe`: a double-bit ECC event.
    DoubleBitEcc(String),
    /// `<uuid> gone`: the GPU (the parent, for a MIG UUID) falls off the bus.
    Gone(String),
    /// `wait-error <code>`: the next `nvmlEventSetWait` of any set fails with `code`.
    WaitError(u32),
}

impl Line {
    pub(super) fn parse(line: &str) -> Option<Line> {
        let mut words = line.split_whitespace();
        let (Some(first), Some(second), None) = (words.next(), words.next(), words.next()) else {
            return None;
        };
        match (first, second) {
            ("wait-error", code) => code.parse().ok().map(Line::WaitError),
            (uuid, "gone") => Some(Line::Gone(uuid.to_string())),
            (uuid, "dbe") => Some(Line::DoubleBitEcc(uuid.to_string())),
            (uuid, xid) => xid.parse().ok().map(|xid| Line::Xid(uuid.to_string(), xid)),
        }
    }
}

/// An event ready to hand out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Event {
    pub device: Dev,
    pub event_type: u64,
    pub data: u64,
    pub gpu_instance_id: u32,
    pub compute_instance_id: u32,
}

#[derive(Debug)]
pub(super) struct EventSet {
    pub(super) created: Instant,
    /// Registered event mask per visible GPU.
    pub(super) registered: Vec<u64>,
    /// Which of the config's `xid_events` this set has delivered.
    pub(super) delivered: Vec<bool>,
    /// How far into the event file this set has read (every set reads it from the start).
    pub(super) file_offset: u64,
    pub(super) pending: VecDeque<Event>,
}

/// An event of `event_type` on `uuid` (a GPU, or a MIG device of one) if its GPU is
/// registered for that type. A lost GPU still delivers (XID 79 is how a GPU says it fell
/// off the bus).
pub(super) fn event(
    node: &Node,
    set: &EventSet,
    uuid: &str,
    event_type: u64,
    data: u64,
) -> Option<Event> {
    let dev = node.by_uuid(uuid)?;
    if set.registered.get(dev.gpu())? & event_type == 0 {
        return None;
    }
    let (gpu_instance_id, compute_instance_id) = match dev {
        Dev::Gpu(_) => (NO_INSTANCE, NO_INSTANCE),
        Dev::Mig(g, m) => node.mig(g, m).map_or((NO_INSTANCE, NO_INSTANCE), |mig| {
            (mig.gpu_instance_id, mig.compute_instance_id)
        }),
    };
    Some(Event {
        device: Dev::Gpu(dev.gpu()),
        event_type,
        data,
        gpu_instance_id,
        compute_instance_id,
    })
}

/// The complete lines appended since `offset`, parsed, advancing it past them; a malformed
/// line comes back as its text. A partial last line waits for its newline.
pub(super) fn read_new_lines(path: &Path, offset: &mut u64) -> Vec<Result<Line, String>> {
    let Ok(mut file) = std::fs::File::open(path) else {
        return Vec::new();
    };
    let mut bytes = Vec::new();
    if file.seek(SeekFrom::Start(*offset)).is_err() || file.read_to_end(&mut bytes).is_err() {
        return Vec::new();
    }
    let Some(end) = bytes.iter().rposition(|&b| b == b'\n') else {
        return Vec::new();
    };
    *offset += end as u64 + 1;
    String::from_utf8_lossy(&bytes[..end])
        .lines()
        .filter(|line| !line.trim().is_empty())
        .map(|line| Line::parse(line).ok_or_else(|| line.to_string()))
        .collect()
}
