//! Reading one thread's Python stack out of the target's memory, py-spy's way: plain
//! `process_vm_readv` while the target runs (no ptrace stop), from a `PyThreadState` address to
//! the chain of frames, each named by its code object (qualname or name, filename, first line).
//!
//! What was verified, against the headers and libraries of pyenv's CPython 3.9.18, 3.10.13,
//! 3.11.7, 3.12.1 and 3.13.0 (the offsets by the `offsets_match_headers` test, the walk by the
//! root test `tests/pystack.rs`):
//!
//! - `_PyEval_EvalFrameDefault(PyThreadState *tstate, PyFrameObject *f, int exc)` in 3.9/3.10 and
//!   `(PyThreadState *tstate, struct _PyInterpreterFrame *f, int exc)` in 3.11–3.13
//!   (`cpython/ceval.h`): the probe's arg0 is the thread state this reader takes.
//! - 3.9/3.10: `tstate->frame` is the executing `PyFrameObject*`, linked by `f_back`, code in
//!   `f_code`. (3.10 also has `tstate->cframe`, which it does not use for frames.)
//! - 3.11/3.12: `tstate->cframe->current_frame` is the executing `_PyInterpreterFrame*`, linked
//!   by `previous`, code in `f_code`. 3.12 pushes a shim frame per C→Python entry, owned by
//!   `FRAME_OWNED_BY_CSTACK` (3) with the interpreter's trampoline code object: skipped.
//! - 3.13: `tstate->current_frame`, `previous`, `f_executable` (a code object or `None`); shim
//!   frames again `FRAME_OWNED_BY_CSTACK`. The same offsets are published in
//!   `_PyRuntime.debug_offsets` (`_Py_DebugOffsets`, first field of `_PyRuntimeState`, stable
//!   within a minor version): the test checks the table against it, and [`StackReader::from_target`]
//!   checks a live 3.13 target against it (which also refuses free-threaded builds, whose object
//!   header is larger).
//! - 3.14 is refused ([`StackError::Unsupported`]): its headers are not on this machine, so its
//!   offsets are not verified.
//!
//! A frame's line is its code object's `co_firstlineno` (the line of the `def`). The innermost
//! frames' *executing* lines ([`Stack::lines`]: where a thread blocked in `.item()` or
//! `time.sleep` called it) come from the frame's instruction offset (3.9 `f_lasti` in bytes,
//! 3.10 `f_lasti` in code units, 3.11/3.12 `prev_instr` and 3.13 `instr_ptr` less the code's
//! first code unit `co_code_adaptive`) and the code object's line table (`co_lnotab` in 3.9,
//! `co_linetable` after), whose three formats [`super::linetable`] decodes (checked against
//! CPython 3.9–3.13's own `co_lines()`; the root test `tests/pystack.rs` checks the line of a
//! live thread of each version).
//!
//! The target runs while we read, so any read may be torn. The walk is bounded (at most
//! [`MAX_DEPTH`] frames reported, [`MAX_WALK`] links followed), refuses misaligned pointers and
//! cycles (retried, [`ATTEMPTS`] tries in all), and skips frames whose code is not a code object
//! (`ob_type != PyCode_Type`): garbage gives an error or a shorter stack, never a hang or a
//! panic. On 3.11+ the frames of a thread are contiguous in its data stack, so one read copies
//! up to [`FRAME_WINDOW`] bytes and serves the callers found in it (4 reads for a 41-frame stack
//! instead of 42; `docs/python-stacks.md` has the measurements).
use std::collections::HashMap;
use std::sync::Arc;

use super::memory::{MemError, TargetMemory};
use super::python::{
    self, CodeOffsets, CodeReader, FrameLayout, PythonError, PythonTarget, Version,
};

/// The most frames a stack reports (the innermost ones; [`Stack::truncated`] says so).
pub const MAX_DEPTH: usize = 128;
/// The most `previous`/`f_back` links followed, shim frames included.
pub const MAX_WALK: usize = 4 * MAX_DEPTH;
/// Code objects whose names are kept; the cache is emptied when it would grow past this.
pub const CACHE_LIMIT: usize = 4096;
/// Bytes of a 3.11+ thread's data stack read at once, ending at the frame being read: its
/// callers' frames usually lie in them.
pub const FRAME_WINDOW: usize = 4096;
/// The smallest page size: the start of the 4 KiB block holding a readable address is readable
/// on any page size.
const PAGE: u64 = 4096;
/// Tries per [`StackReader::read`] when a read is torn.
pub const ATTEMPTS: u32 = 3;
/// The most thread states followed when looking for the main thread's.
const MAX_THREADS: usize = 4096;
/// Above every user-space address (56 bits with x86_64 5-level paging, 52 on aarch64): a
/// pointer at or past it is garbage, and staying below it keeps `ptr + offset` from overflowing.
const USER_LIMIT: u64 = 1 << 56;

/// Whether `p` can point at a CPython object or frame in the target: non-null, 8-aligned and in
/// user space.
fn plausible(p: u64) -> bool {
    p != 0 && p.is_multiple_of(8) && p < USER_LIMIT
}

#[derive(Debug, thiserror::Error)]
pub enum StackError {
    #[error("reading Python stacks of Python {major}.{minor} is not supported (3.9 to 3.13 are)")]
    Unsupported { major: u32, minor: u32 },
    #[error("process {pid} exited")]
    Exited { pid: u32 },
    #[error(transparent)]
    Mem(MemError),
    #[error("{tstate:#x} is not a thread state address (null, misaligned or not user space)")]
    BadThreadState { tstate: u64 },
    #[error(
        "frame pointer {frame:#x} of thread state {tstate:#x} is misaligned or not user space \
         (torn read)"
    )]
    BadFrame { tstate: u64, frame: u64 },
    #[error("the frame chain of thread state {tstate:#x} loops at {frame:#x} (torn read)")]
    Cycle { tstate: u64, frame: u64 },
    #[error("no thread state of the main thread in process {pid}")]
    NoMainThread { pid: u32 },
    #[error("the Python runtime of process {pid} does not match the offset table: {what}")]
    Layout { pid: u32, what: String },
    #[error(transparent)]
    Python(#[from] PythonError),
}

impl From<MemError> for StackError {
    fn from(e: MemError) -> Self {
        match e {
            MemError::Read {
                pid, ref source, ..
            } if source.raw_os_error() == Some(libc::ESRCH) => StackError::Exited { pid },
            e => StackError::Mem(e),
        }
    }
}

/// Offsets of the fields the walk reads, for one CPython minor version (x86_64/aarch64 LP64,
/// default, GIL build).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StackOffsets {
    /// In `PyThreadState`: `frame` (3.9/3.10), `cframe` (3.11/3.12), `current_frame` (3.13).
    pub tstate_frame: u64,
    /// `_PyCFrame.current_frame` when `tstate_frame` points at a `_PyCFrame` (3.11/3.12).
    pub cframe_current_frame: Option<u64>,
    /// `PyFrameObject.f_back` (3.9/3.10) or `_PyInterpreterFrame.previous`.
    pub frame_back: u64,
    /// `PyFrameObject.f_code`, `_PyInterpreterFrame.f_code` or `.f_executable` (3.13).
    pub frame_code: u64,
    /// `_PyInterpreterFrame.owner` (a `char`, 3.11+).
    pub frame_owner: Option<u64>,
    /// `FRAME_OWNED_BY_CSTACK`: the owner of shim frames (3.12+).
    pub owned_by_cstack: Option<u8>,
    /// `PyCodeObject.co_firstlineno` (an `int`).
    pub code_firstlineno: u64,
    /// Where the frame's instruction offset is: `PyFrameObject.f_lasti` (an `int`, 3.9/3.10),
    /// `_PyInterpreterFrame.prev_instr` (3.11/3.12) or `.instr_ptr` (3.13), read as [`Self::instr`] says.
    pub frame_instr: u64,
    pub instr: Instr,
    /// `PyCodeObject.co_lnotab` (3.9) or `.co_linetable` (3.10+): a `bytes` object.
    pub code_linetable: u64,
    /// `PyCodeObject.co_code_adaptive` (3.11+): the first code unit, inside the code object.
    pub code_code: Option<u64>,
    /// `PyThreadState.next`.
    pub tstate_next: u64,
    /// `PyThreadState.thread_id` (`unsigned long`, the thread's `pthread_t`).
    pub tstate_thread_id: u64,
    /// `PyInterpreterState.tstate_head` (3.9/3.10) or `.threads.head`.
    pub interp_threads_head: u64,
    /// `_PyRuntimeState.main_thread`.
    pub runtime_main_thread: u64,
    /// `_PyRuntimeState.interpreters.main`.
    pub runtime_interp_main: u64,
}

/// How a frame says which instruction it executes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Instr {
    /// 3.9: `f_lasti`, the byte offset of the instruction (−1 before the first).
    LastiBytes,
    /// 3.10: `f_lasti`, in 2-byte code units.
    LastiUnits,
    /// 3.11+: a pointer to the code unit, inside the code object from `code_code` on.
    Pointer,
}

/// `offsetof(PyBytesObject, ob_size)` and `ob_sval`: the length and the data of a `bytes`.
const BYTES_SIZE: u64 = 16;
const BYTES_DATA: u64 = 32;
/// The longest line table read (a code object of ~20,000 lines; longer ones get no line).
const MAX_LINETABLE: u64 = 64 * 1024;

/// The offset table.
///
/// Derived by compiling a C program that prints `offsetof(...)` of each field against each
/// pyenv include dir (`gcc -DPy_BUILD_CORE -I ~/.pyenv/versions/3.X.Y/include/python3.X`, with
/// `internal/pycore_frame.h`, `pycore_runtime.h` and `pycore_interp.h`) for 3.9.18, 3.10.13,
/// 3.11.7, 3.12.1 and 3.13.0. The test `offsets_match_headers` re-derives them the same way
/// (the program is `tests::OFFSETS_C`) and, for 3.13, also compares them with the
/// `_Py_DebugOffsets` compiled into libpython.
///
/// | field                  | 3.9 | 3.10 | 3.11 | 3.12 | 3.13 |
/// |------------------------|-----|------|------|------|------|
/// | tstate → frame/cframe  | 24  | 24   | 56   | 56   | 72   |
/// | cframe.current_frame   | –   | –    | 8    | 0    | –    |
/// | frame back/previous    | 24  | 24   | 48   | 8    | 8    |
/// | frame code/executable  | 32  | 32   | 32   | 0    | 0    |
/// | frame owner            | –   | –    | 69   | 70   | 70   |
/// | FRAME_OWNED_BY_CSTACK  | –   | –    | –    | 3    | 3    |
/// | code co_firstlineno    | 40  | 40   | 72   | 68   | 68   |
/// | frame lasti/instr      | 104 | 96   | 56   | 56   | 56   |
/// | code lnotab/linetable  | 120 | 120  | 136  | 136  | 136  |
/// | code co_code_adaptive  | –   | –    | 184  | 192  | 200  |
/// | tstate next            | 8   | 8    | 8    | 8    | 8    |
/// | tstate thread_id       | 176 | 176  | 152  | 136  | 152  |
/// | interp threads head    | 8   | 8    | 16   | 72   | 7344 |
/// | runtime main_thread    | 72  | 72   | 80   | 64   | 656  |
/// | runtime interp. main   | 40  | 40   | 48   | 48   | 640  |
pub fn stack_offsets(v: Version) -> Result<StackOffsets, StackError> {
    let o = match (v.major, v.minor) {
        (3, 9) | (3, 10) => StackOffsets {
            tstate_frame: 24,
            cframe_current_frame: None,
            frame_back: 24,
            frame_code: 32,
            frame_owner: None,
            owned_by_cstack: None,
            code_firstlineno: 40,
            frame_instr: if v.minor == 9 { 104 } else { 96 },
            instr: if v.minor == 9 {
                Instr::LastiBytes
            } else {
                Instr::LastiUnits
            },
            code_linetable: 120,
            code_code: None,
            tstate_next: 8,
            tstate_thread_id: 176,
            interp_threads_head: 8,
            runtime_main_thread: 72,
            runtime_interp_main: 40,
        },
        (3, 11) => StackOffsets {
            tstate_frame: 56,
            cframe_current_frame: Some(8),
            frame_back: 48,
            frame_code: 32,
            frame_owner: Some(69),
            owned_by_cstack: None,
            code_firstlineno: 72,
            frame_instr: 56,
            instr: Instr::Pointer,
            code_linetable: 136,
            code_code: Some(184),
            tstate_next: 8,
            tstate_thread_id: 152,
            interp_threads_head: 16,
            runtime_main_thread: 80,
            runtime_interp_main: 48,
        },
        (3, 12) => StackOffsets {
            tstate_frame: 56,
            cframe_current_frame: Some(0),
            frame_back: 8,
            frame_code: 0,
            frame_owner: Some(70),
            owned_by_cstack: Some(3),
            code_firstlineno: 68,
            frame_instr: 56,
            instr: Instr::Pointer,
            code_linetable: 136,
            code_code: Some(192),
            tstate_next: 8,
            tstate_thread_id: 136,
            interp_threads_head: 72,
            runtime_main_thread: 64,
            runtime_interp_main: 48,
        },
        (3, 13) => StackOffsets {
            tstate_frame: 72,
            cframe_current_frame: None,
            frame_back: 8,
            frame_code: 0,
            frame_owner: Some(70),
            owned_by_cstack: Some(3),
            code_firstlineno: 68,
            frame_instr: 56,
            instr: Instr::Pointer,
            code_linetable: 136,
            code_code: Some(200),
            tstate_next: 8,
            tstate_thread_id: 152,
            interp_threads_head: 7344,
            runtime_main_thread: 656,
            runtime_interp_main: 640,
        },
        (major, minor) => return Err(StackError::Unsupported { major, minor }),
    };
    Ok(o)
}

/// Where 3.13's `_Py_DebugOffsets` (at the start of `_PyRuntime`) holds the values we check,
/// from `offsetof(_Py_DebugOffsets, ...)` in the 3.13.0 headers (stable within 3.13; checked by
/// `offsets_match_headers`). Each pair: position in `_Py_DebugOffsets`, expected value.
const DEBUG_COOKIE: &[u8; 8] = b"xdebugpy";
/// `offsetof(_Py_DebugOffsets, free_threaded)`.
const DEBUG_FREE_THREADED: u64 = 16;

fn debug_checks_313(o: &StackOffsets) -> [(&'static str, u64, u64); 9] {
    [
        ("thread_state.current_frame", 184, o.tstate_frame),
        ("thread_state.next", 168, o.tstate_next),
        ("thread_state.thread_id", 192, o.tstate_thread_id),
        ("interpreter_frame.previous", 232, o.frame_back),
        ("interpreter_frame.executable", 240, o.frame_code),
        ("interpreter_frame.instr_ptr", 248, o.frame_instr),
        ("code_object.firstlineno", 312, o.code_firstlineno),
        ("code_object.linetable", 304, o.code_linetable),
        (
            "code_object.co_code_adaptive",
            344,
            o.code_code.unwrap_or(0),
        ),
    ]
}

/// One Python frame.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PyFrame {
    /// `co_qualname` (3.11+, e.g. `Klass.method`) or `co_name` (3.9/3.10, e.g. `method`).
    pub function: Arc<str>,
    pub file: Arc<str>,
    /// `co_firstlineno`: the first line of the function, not the line executing now.
    pub line: u32,
}

/// One thread's stack, outermost frame first.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Stack {
    pub frames: Vec<PyFrame>,
    /// The walk stopped at [`MAX_DEPTH`] frames or [`MAX_WALK`] links: the outermost frames are
    /// missing.
    pub truncated: bool,
    /// The lines the innermost [`INNER_LINES`] frames execute, innermost first (`None`: the
    /// frame's instruction offset or line table could not be read, or the offset has no line).
    pub lines: Vec<Option<u32>>,
}

/// Frames, from the innermost, whose executing line a stack carries: enough to pass the
/// Python wrappers of a library (`Tensor.item` in a Python-level torch) to the caller's line.
pub const INNER_LINES: usize = 8;

/// Reads Python stacks of one target; keeps a bounded cache of code objects' names.
pub struct StackReader {
    offsets: StackOffsets,
    code_mask: u64,
    /// Bytes read per frame: enough for its link, code and owner fields.
    frame_len: usize,
    codes: CodeReader,
    /// Code objects read: their names, and their line table once an innermost frame needed it.
    cache: HashMap<u64, CachedCode>,
    format: Option<super::linetable::TableFormat>,
    window: MemWindow,
}

/// A code object's names and, read on first need, its line table (`Some(None)`: unreadable).
struct CachedCode {
    frame: PyFrame,
    table: Option<Option<Arc<[u8]>>>,
}

/// A copy of target memory from one read, reused for the frames that lie in it.
#[derive(Default)]
struct MemWindow {
    start: u64,
    /// How many bytes of `bytes` hold target memory from `start`.
    valid: usize,
    bytes: Vec<u8>,
}

impl MemWindow {
    /// `len` bytes of target memory at `addr`: from the copy when it holds them, else read along
    /// with up to `window` bytes below `addr + len` (a plain read of `len` bytes when that
    /// range is not all mapped).
    fn get(
        &mut self,
        mem: &TargetMemory,
        addr: u64,
        len: usize,
        window: usize,
    ) -> Result<&[u8], MemError> {
        let end = addr.saturating_add(len as u64);
        if addr >= self.start && end <= self.start + self.valid as u64 {
            let at = (addr - self.start) as usize;
            return Ok(&self.bytes[at..at + len]);
        }
        self.valid = 0;
        let full = end.saturating_sub(window as u64);
        // The whole window, else from the start of `addr`'s page (the pages below may be
        // unmapped: a data stack chunk's first frames), else just the `len` bytes.
        let page = addr & !(PAGE - 1);
        let mut starts = [full, page.max(full), addr];
        if window <= len {
            starts = [addr; 3];
        }
        let mut last = None;
        for (i, &start) in starts.iter().enumerate() {
            if i > 0 && start == starts[i - 1] {
                continue;
            }
            let n = (end - start) as usize;
            if self.bytes.len() < n {
                self.bytes.resize(n, 0);
            }
            match mem.read(start, &mut self.bytes[..n]) {
                Ok(()) => {
                    self.start = start;
                    self.valid = n;
                    let at = (addr - start) as usize;
                    return Ok(&self.bytes[at..at + len]);
                }
                Err(e) => last = Some(e),
            }
        }
        Err(last.expect("at least one read"))
    }
}

impl StackReader {
    pub fn new(
        version: Version,
        offsets: CodeOffsets,
        layout: FrameLayout,
        code_type_addr: u64,
    ) -> Result<Self, StackError> {
        let table = stack_offsets(version)?;
        let frame_len = (table.frame_back + 8)
            .max(table.frame_code + 8)
            .max(table.frame_instr + 8)
            .max(table.frame_owner.map_or(0, |o| o + 1)) as usize;
        Ok(StackReader {
            offsets: table,
            code_mask: layout.code_mask,
            frame_len,
            codes: CodeReader {
                layout,
                offsets,
                code_type_addr,
            },
            cache: HashMap::new(),
            format: super::linetable::TableFormat::of_minor(version.minor),
            window: MemWindow::default(),
        })
    }

    /// A reader for a found target: learns the code object's offsets from the target and, on
    /// 3.13, checks the table against the target's `_Py_DebugOffsets`.
    pub fn from_target(target: &PythonTarget, mem: &TargetMemory) -> Result<Self, StackError> {
        let offsets = python::code_offsets(mem, target.code_type_addr)?;
        let reader = StackReader::new(
            target.version,
            offsets,
            target.layout,
            target.code_type_addr,
        )?;
        if (target.version.major, target.version.minor) == (3, 13) {
            reader.check_debug_offsets(mem, runtime_addr(target)?)?;
        }
        Ok(reader)
    }

    pub fn offsets(&self) -> &StackOffsets {
        &self.offsets
    }

    /// Compares the table with 3.13's `_Py_DebugOffsets` in the target's `_PyRuntime`.
    fn check_debug_offsets(&self, mem: &TargetMemory, runtime: u64) -> Result<(), StackError> {
        let layout = |what: String| StackError::Layout {
            pid: mem.pid(),
            what,
        };
        let mut cookie = [0u8; 8];
        mem.read(runtime, &mut cookie)?;
        if &cookie != DEBUG_COOKIE {
            return Err(layout(format!(
                "_PyRuntime does not start with the {:?} cookie",
                String::from_utf8_lossy(DEBUG_COOKIE)
            )));
        }
        if mem.read_u64(runtime + DEBUG_FREE_THREADED)? != 0 {
            return Err(layout("free-threaded build".into()));
        }
        for (name, at, want) in debug_checks_313(&self.offsets) {
            let got = mem.read_u64(runtime + at)?;
            if got != want {
                return Err(layout(format!("{name} is {got}, the table says {want}")));
            }
        }
        Ok(())
    }

    /// The stack of the thread whose `PyThreadState` is at `tstate`, outermost frame first.
    ///
    /// Costs one read for the thread state (two on 3.11/3.12), then on 3.9/3.10 one per frame
    /// (frame objects are scattered on the heap) and on 3.11+ about one per [`FRAME_WINDOW`]
    /// bytes of the thread's data stack (frames are contiguous there, callers below callees),
    /// plus three or four per code object not seen before. A torn read (a frame popped while
    /// we walk) is retried, [`ATTEMPTS`] times in all, before its error is returned.
    pub fn read(&mut self, mem: &TargetMemory, tstate: u64) -> Result<Stack, StackError> {
        if !plausible(tstate) {
            return Err(StackError::BadThreadState { tstate });
        }
        let mut window = std::mem::take(&mut self.window);
        let mut attempt = 1;
        let result = loop {
            window.valid = 0;
            match self.read_once(mem, tstate, &mut window) {
                Err(
                    StackError::BadFrame { .. } | StackError::Cycle { .. } | StackError::Mem(_),
                ) if attempt < ATTEMPTS => attempt += 1,
                r => break r,
            }
        };
        self.window = window;
        result
    }

    fn read_once(
        &mut self,
        mem: &TargetMemory,
        tstate: u64,
        window: &mut MemWindow,
    ) -> Result<Stack, StackError> {
        let o = self.offsets;
        let mut frame = mem.read_u64(tstate + o.tstate_frame)?;
        if let Some(current) = o.cframe_current_frame {
            if frame == 0 {
                return Ok(Stack::default());
            }
            if !plausible(frame) {
                return Err(StackError::BadFrame { tstate, frame });
            }
            frame = mem.read_u64(frame + current)?;
        }
        let window_len = if o.frame_owner.is_some() {
            FRAME_WINDOW
        } else {
            0
        };
        let mut stack = Stack::default();
        let mut seen: Vec<u64> = Vec::with_capacity(64);
        let word = |b: &[u8], off: u64| {
            let o = off as usize;
            u64::from_le_bytes(b[o..o + 8].try_into().expect("8 bytes"))
        };
        for _ in 0..MAX_WALK {
            if frame == 0 {
                break;
            }
            if !plausible(frame) {
                return Err(StackError::BadFrame { tstate, frame });
            }
            if seen.contains(&frame) {
                return Err(StackError::Cycle { tstate, frame });
            }
            seen.push(frame);
            let buf = window.get(mem, frame, self.frame_len, window_len)?;
            let back = word(buf, o.frame_back);
            let code = word(buf, o.frame_code) & self.code_mask;
            let shim = match (o.frame_owner, o.owned_by_cstack) {
                (Some(at), Some(cstack)) => buf[at as usize] == cstack,
                _ => false,
            };
            if !shim
                && plausible(code)
                && let Some(f) = self.code(mem, code)?
            {
                if stack.frames.len() == MAX_DEPTH {
                    stack.truncated = true;
                    break;
                }
                if stack.lines.len() < INNER_LINES {
                    let offset = self.instr_offset(buf, code);
                    let line = offset.and_then(|at| self.line_at(mem, code, f.line, at));
                    stack.lines.push(line);
                }
                stack.frames.push(f);
            }
            frame = back;
        }
        if frame != 0 && !stack.truncated {
            stack.truncated = true;
        }
        stack.frames.reverse();
        Ok(stack)
    }

    /// The byte offset of the instruction a frame (its first bytes in `buf`) executes in its
    /// code object at `code`; `None` before its first instruction or when torn.
    fn instr_offset(&self, buf: &[u8], code: u64) -> Option<u64> {
        let at = self.offsets.frame_instr as usize;
        let int = || i32::from_le_bytes(buf[at..at + 4].try_into().expect("4 bytes"));
        match self.offsets.instr {
            Instr::LastiBytes => u64::try_from(int()).ok(),
            Instr::LastiUnits => u64::try_from(int()).ok().map(|u| u * 2),
            Instr::Pointer => {
                let ptr = u64::from_le_bytes(buf[at..at + 8].try_into().expect("8 bytes"));
                let first = code.checked_add(self.offsets.code_code?)?;
                ptr.checked_sub(first)
                    .filter(|o| o % 2 == 0 && *o < 1 << 24)
            }
        }
    }

    /// The line of the code object at `code` (first line `first_line`) at byte offset `at`,
    /// from its line table (read once per code object).
    fn line_at(&mut self, mem: &TargetMemory, code: u64, first_line: u32, at: u64) -> Option<u32> {
        let format = self.format?;
        let cached = self.cache.get(&code).and_then(|c| c.table.clone());
        let table = match cached {
            Some(t) => t,
            None => {
                let t = self.read_table(mem, code);
                if let Some(c) = self.cache.get_mut(&code) {
                    c.table = Some(t.clone());
                }
                t
            }
        }?;
        super::linetable::line_at(format, &table, first_line, at)
    }

    /// The `bytes` of a code object's line table; `None` when unreadable or implausible.
    fn read_table(&self, mem: &TargetMemory, code: u64) -> Option<Arc<[u8]>> {
        let bytes = mem.read_u64(code + self.offsets.code_linetable).ok()?;
        if !plausible(bytes) {
            return None;
        }
        let len = mem.read_u64(bytes + BYTES_SIZE).ok()?;
        if len > MAX_LINETABLE {
            return None;
        }
        let mut data = vec![0u8; len as usize];
        mem.read(bytes + BYTES_DATA, &mut data).ok()?;
        Some(data.into())
    }

    /// The names of the code object at `code`, from the cache or the target; `None` when it is
    /// not a code object.
    fn code(&mut self, mem: &TargetMemory, code: u64) -> Result<Option<PyFrame>, StackError> {
        if let Some(c) = self.cache.get(&code) {
            return Ok(Some(c.frame.clone()));
        }
        let Some(names) = self.codes.read(mem, code)? else {
            return Ok(None);
        };
        let line = mem.read_u32(code + self.offsets.code_firstlineno)?;
        let f = PyFrame {
            function: names.qualname.into(),
            file: names.filename.into(),
            // An `int`: a negative value is garbage.
            line: if (line as i32) < 0 { 0 } else { line },
        };
        if self.cache.len() >= CACHE_LIMIT {
            self.cache.clear();
        }
        self.cache.insert(
            code,
            CachedCode {
                frame: f.clone(),
                table: None,
            },
        );
        Ok(Some(f))
    }

    /// The `PyThreadState` of the main thread (the one that initialized Python) of the main
    /// interpreter, found from `_PyRuntime` ([`runtime_addr`]).
    pub fn main_thread(&self, mem: &TargetMemory, runtime: u64) -> Result<u64, StackError> {
        let o = self.offsets;
        let main = mem.read_u64(runtime + o.runtime_main_thread)?;
        let interp = mem.read_u64(runtime + o.runtime_interp_main)?;
        let none = || StackError::NoMainThread { pid: mem.pid() };
        if !plausible(interp) {
            return Err(none());
        }
        let mut t = mem.read_u64(interp + o.interp_threads_head)?;
        for _ in 0..MAX_THREADS {
            if !plausible(t) {
                break;
            }
            if mem.read_u64(t + o.tstate_thread_id)? == main {
                return Ok(t);
            }
            t = mem.read_u64(t + o.tstate_next)?;
        }
        Err(none())
    }
}

impl StackReader {
    /// The `PyThreadState` of the main thread, else the first of the main interpreter's
    /// threads: in a forked child (a DataLoader worker) only the forking thread's state is left,
    /// whatever `_PyRuntime.main_thread` still says.
    pub fn main_or_first_thread(
        &self,
        mem: &TargetMemory,
        runtime: u64,
    ) -> Result<u64, StackError> {
        match self.main_thread(mem, runtime) {
            Ok(t) => Ok(t),
            Err(StackError::NoMainThread { .. }) => {
                let o = self.offsets;
                let interp = mem.read_u64(runtime + o.runtime_interp_main)?;
                let t = if plausible(interp) {
                    mem.read_u64(interp + o.interp_threads_head)?
                } else {
                    0
                };
                if plausible(t) {
                    Ok(t)
                } else {
                    Err(StackError::NoMainThread { pid: mem.pid() })
                }
            }
            Err(e) => Err(e),
        }
    }
}

/// The runtime address of `_PyRuntime` in the target (same file as `PyCode_Type`).
pub fn runtime_addr(target: &PythonTarget) -> Result<u64, StackError> {
    let code_type = target
        .elf
        .symbol("PyCode_Type")
        .map_err(PythonError::from)?;
    let runtime = target.elf.symbol("_PyRuntime").map_err(PythonError::from)?;
    Ok(target
        .code_type_addr
        .wrapping_sub(code_type.addr)
        .wrapping_add(runtime.addr))
}

#[cfg(test)]
pub(super) mod tests {
    use std::collections::BTreeMap;
    use std::path::{Path, PathBuf};
    use std::process::Command;

    use super::*;

    /// Prints `name value` for each field of [`StackOffsets`] (and, on 3.13, the
    /// `_Py_DebugOffsets` positions and the values compiled into libpython). Built against a
    /// CPython include dir with `-DPy_BUILD_CORE` and linked with its libpython.
    pub const OFFSETS_C: &str = r#"
#include <Python.h>
#include <stdio.h>
#include <stddef.h>
#if PY_VERSION_HEX < 0x030B0000
#include <frameobject.h>
#else
#include "internal/pycore_frame.h"
#endif
#include "internal/pycore_runtime.h"
#include "internal/pycore_interp.h"
#define P(name, v) printf("%s %ld\n", name, (long)(v))
int main(void) {
#if PY_VERSION_HEX < 0x030B0000
    P("tstate_frame", offsetof(PyThreadState, frame));
    P("frame_back", offsetof(PyFrameObject, f_back));
    P("frame_code", offsetof(PyFrameObject, f_code));
    P("interp_threads_head", offsetof(PyInterpreterState, tstate_head));
#else
#if PY_VERSION_HEX < 0x030D0000
    P("tstate_frame", offsetof(PyThreadState, cframe));
    P("cframe_current_frame", offsetof(_PyCFrame, current_frame));
    P("frame_code", offsetof(_PyInterpreterFrame, f_code));
#else
    P("tstate_frame", offsetof(PyThreadState, current_frame));
    P("frame_code", offsetof(_PyInterpreterFrame, f_executable));
#endif
    P("frame_back", offsetof(_PyInterpreterFrame, previous));
    P("frame_owner", offsetof(_PyInterpreterFrame, owner));
    P("interp_threads_head", offsetof(PyInterpreterState, threads.head));
#endif
#if PY_VERSION_HEX >= 0x030C0000
    P("owned_by_cstack", FRAME_OWNED_BY_CSTACK);
#endif
    P("code_firstlineno", offsetof(PyCodeObject, co_firstlineno));
#if PY_VERSION_HEX < 0x030A0000
    P("frame_instr", offsetof(PyFrameObject, f_lasti));
    P("code_linetable", offsetof(PyCodeObject, co_lnotab));
#elif PY_VERSION_HEX < 0x030B0000
    P("frame_instr", offsetof(PyFrameObject, f_lasti));
    P("code_linetable", offsetof(PyCodeObject, co_linetable));
#else
#if PY_VERSION_HEX < 0x030D0000
    P("frame_instr", offsetof(_PyInterpreterFrame, prev_instr));
#else
    P("frame_instr", offsetof(_PyInterpreterFrame, instr_ptr));
#endif
    P("code_linetable", offsetof(PyCodeObject, co_linetable));
    P("code_code", offsetof(PyCodeObject, co_code_adaptive));
#endif
    P("bytes_size", offsetof(PyVarObject, ob_size));
    P("bytes_data", offsetof(PyBytesObject, ob_sval));
    P("object_type", offsetof(PyObject, ob_type));
    P("tstate_next", offsetof(PyThreadState, next));
    P("tstate_thread_id", offsetof(PyThreadState, thread_id));
    P("runtime_main_thread", offsetof(_PyRuntimeState, main_thread));
    P("runtime_interp_main", offsetof(_PyRuntimeState, interpreters.main));
#if PY_VERSION_HEX >= 0x030D0000
    P("runtime_debug_offsets", offsetof(_PyRuntimeState, debug_offsets));
    P("debugpos_free_threaded", offsetof(_Py_DebugOffsets, free_threaded));
    P("debugpos_thread_state.current_frame", offsetof(_Py_DebugOffsets, thread_state.current_frame));
    P("debugpos_thread_state.next", offsetof(_Py_DebugOffsets, thread_state.next));
    P("debugpos_thread_state.thread_id", offsetof(_Py_DebugOffsets, thread_state.thread_id));
    P("debugpos_interpreter_frame.previous", offsetof(_Py_DebugOffsets, interpreter_frame.previous));
    P("debugpos_interpreter_frame.executable", offsetof(_Py_DebugOffsets, interpreter_frame.executable));
    P("debugpos_code_object.firstlineno", offsetof(_Py_DebugOffsets, code_object.firstlineno));
    P("debugpos_interpreter_frame.instr_ptr", offsetof(_Py_DebugOffsets, interpreter_frame.instr_ptr));
    P("debugpos_code_object.linetable", offsetof(_Py_DebugOffsets, code_object.linetable));
    P("debugpos_code_object.co_code_adaptive", offsetof(_Py_DebugOffsets, code_object.co_code_adaptive));
    const _Py_DebugOffsets *d = &_PyRuntime.debug_offsets;
    P("debug_free_threaded", d->free_threaded);
    P("debug_thread_state.current_frame", d->thread_state.current_frame);
    P("debug_thread_state.next", d->thread_state.next);
    P("debug_thread_state.thread_id", d->thread_state.thread_id);
    P("debug_interpreter_frame.previous", d->interpreter_frame.previous);
    P("debug_interpreter_frame.executable", d->interpreter_frame.executable);
    P("debug_interpreter_frame.owner", d->interpreter_frame.owner);
    P("debug_code_object.firstlineno", d->code_object.firstlineno);
    P("debug_interpreter_frame.instr_ptr", d->interpreter_frame.instr_ptr);
    P("debug_code_object.linetable", d->code_object.linetable);
    P("debug_code_object.co_code_adaptive", d->code_object.co_code_adaptive);
    P("debug_interpreter_state.threads_head", d->interpreter_state.threads_head);
#endif
    return 0;
}
"#;

    fn v(minor: u32) -> Version {
        Version {
            major: 3,
            minor,
            micro: None,
        }
    }

    /// pyenv's `3.<minor>.*` install dirs.
    /// pyenv's installs of CPython 3.`minor` (`$PYENV_ROOT`, else `~/.pyenv`), oldest first.
    pub(in crate::attach) fn pyenv_dirs(minor: u32) -> Vec<PathBuf> {
        let root = std::env::var_os("PYENV_ROOT")
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|h| Path::new(&h).join(".pyenv")))
            .unwrap_or_else(|| PathBuf::from("/root/.pyenv"));
        let Ok(dir) = std::fs::read_dir(root.join("versions")) else {
            return Vec::new();
        };
        let prefix = format!("3.{minor}.");
        let mut out: Vec<PathBuf> = dir
            .flatten()
            .filter(|e| {
                e.file_name().to_str().is_some_and(|n| {
                    n.strip_prefix(&prefix)
                        .is_some_and(|r| !r.is_empty() && r.chars().all(|c| c.is_ascii_digit()))
                })
            })
            .map(|e| e.path())
            .collect();
        out.sort();
        out
    }

    /// Compiles and runs [`OFFSETS_C`] against one install; `None` (with a message) when it
    /// cannot be built here.
    fn header_offsets(prefix: &Path, minor: u32) -> Option<BTreeMap<String, u64>> {
        let include = prefix.join(format!("include/python3.{minor}"));
        let lib = prefix.join("lib");
        if !include.join("internal").is_dir() {
            println!("skip {}: no internal headers", prefix.display());
            return None;
        }
        let dir = std::env::temp_dir().join(format!(
            "traceml-pystack-offsets-3{minor}-{}",
            std::process::id()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let src = dir.join("offsets.c");
        let exe = dir.join("offsets");
        std::fs::write(&src, OFFSETS_C).unwrap();
        let built = Command::new("gcc")
            .arg("-DPy_BUILD_CORE")
            .arg("-I")
            .arg(&include)
            .arg(&src)
            .arg("-o")
            .arg(&exe)
            .arg(format!("-L{}", lib.display()))
            .arg(format!("-lpython3.{minor}"))
            .arg(format!("-Wl,-rpath,{}", lib.display()))
            .output();
        let built = match built {
            Ok(b) => b,
            Err(e) => {
                println!("skip {}: cannot run gcc: {e}", prefix.display());
                return None;
            }
        };
        assert!(
            built.status.success(),
            "offsets.c does not build against {}: {}",
            include.display(),
            String::from_utf8_lossy(&built.stderr)
        );
        let out = Command::new(&exe).output().unwrap();
        assert!(out.status.success());
        let _ = std::fs::remove_dir_all(&dir);
        Some(
            String::from_utf8(out.stdout)
                .unwrap()
                .lines()
                .map(|l| {
                    let (k, v) = l.split_once(' ').unwrap();
                    (k.to_string(), v.parse().unwrap())
                })
                .collect(),
        )
    }

    /// The table, as the names [`OFFSETS_C`] prints.
    fn named(o: &StackOffsets) -> BTreeMap<String, u64> {
        let mut m = BTreeMap::new();
        let mut put = |k: &str, v: Option<u64>| {
            if let Some(v) = v {
                m.insert(k.to_string(), v);
            }
        };
        put("tstate_frame", Some(o.tstate_frame));
        put("cframe_current_frame", o.cframe_current_frame);
        put("frame_back", Some(o.frame_back));
        put("frame_code", Some(o.frame_code));
        put("frame_owner", o.frame_owner);
        put("owned_by_cstack", o.owned_by_cstack.map(u64::from));
        put("code_firstlineno", Some(o.code_firstlineno));
        put("frame_instr", Some(o.frame_instr));
        put("code_linetable", Some(o.code_linetable));
        put("code_code", o.code_code);
        put("bytes_size", Some(BYTES_SIZE));
        put("bytes_data", Some(BYTES_DATA));
        put("object_type", Some(8));
        put("tstate_next", Some(o.tstate_next));
        put("tstate_thread_id", Some(o.tstate_thread_id));
        put("interp_threads_head", Some(o.interp_threads_head));
        put("runtime_main_thread", Some(o.runtime_main_thread));
        put("runtime_interp_main", Some(o.runtime_interp_main));
        m
    }

    /// Re-derives the table from the headers of every pyenv CPython 3.9–3.13 on the machine.
    #[test]
    fn offsets_match_headers() {
        let mut checked = 0;
        for minor in 9..=13 {
            let dirs = pyenv_dirs(minor);
            if dirs.is_empty() {
                println!("skip 3.{minor}: no pyenv install");
            }
            for prefix in dirs {
                let Some(got) = header_offsets(&prefix, minor) else {
                    continue;
                };
                let table = stack_offsets(v(minor)).unwrap();
                let base: BTreeMap<String, u64> = got
                    .iter()
                    .filter(|(k, _)| !k.starts_with("debug") && !k.starts_with("runtime_debug"))
                    .map(|(k, v)| (k.clone(), *v))
                    .collect();
                assert_eq!(base, named(&table), "{}", prefix.display());
                if minor == 13 {
                    assert_eq!(got["runtime_debug_offsets"], 0);
                    assert_eq!(got["debugpos_free_threaded"], DEBUG_FREE_THREADED);
                    assert_eq!(got["debug_free_threaded"], 0);
                    for (name, at, want) in debug_checks_313(&table) {
                        assert_eq!(got[&format!("debugpos_{name}")], at, "{name}");
                        assert_eq!(got[&format!("debug_{name}")], want, "{name}");
                    }
                    assert_eq!(
                        got["debug_interpreter_frame.owner"],
                        table.frame_owner.unwrap()
                    );
                    assert_eq!(
                        got["debug_interpreter_state.threads_head"],
                        table.interp_threads_head
                    );
                }
                println!("3.{minor}: table matches {}", prefix.display());
                checked += 1;
            }
        }
        if checked == 0 {
            println!("skip: no pyenv CPython 3.9-3.13 headers here");
        }
    }

    #[test]
    fn table_agrees_with_frame_layout() {
        for minor in 9..=13 {
            let o = stack_offsets(v(minor)).unwrap();
            let layout = python::frame_layout(v(minor)).unwrap();
            assert_eq!(o.frame_code, layout.code_offset, "3.{minor}");
        }
        for minor in [8, 14] {
            assert!(matches!(
                stack_offsets(v(minor)),
                Err(StackError::Unsupported { .. })
            ));
        }
    }

    /// A fake 3.12 target laid out in our own memory: a thread state, a cframe, frames (one a
    /// shim, one whose code is not a code object) and code objects with ASCII strings.
    struct Fake {
        words: Vec<u64>,
    }

    impl Fake {
        fn new() -> Self {
            Fake {
                words: vec![0; 4096],
            }
        }
        fn base(&self) -> u64 {
            self.words.as_ptr() as u64
        }
        fn addr(&self, word: usize) -> u64 {
            self.base() + 8 * word as u64
        }
        fn set(&mut self, word: usize, v: u64) {
            self.words[word] = v;
        }
        fn set_byte(&mut self, word: usize, byte: usize, v: u8) {
            let mut b = self.words[word].to_le_bytes();
            b[byte] = v;
            self.words[word] = u64::from_le_bytes(b);
        }
        /// A compact ASCII str (3.12 header: 40 bytes) at `word`.
        fn str_at(&mut self, word: usize, s: &str) {
            self.set(word + 2, s.len() as u64);
            // state: kind 1, compact, ascii
            self.set(word + 4, (1 << 2) | (1 << 5) | (1 << 6));
            let mut bytes = s.as_bytes().to_vec();
            bytes.resize(s.len().div_ceil(8) * 8 + 8, 0);
            for (i, c) in bytes.chunks(8).enumerate() {
                self.set(word + 5 + i, u64::from_le_bytes(c.try_into().unwrap()));
            }
        }
    }

    const CODE_TYPE_WORD: usize = 0;
    const CODE_OFFSETS: CodeOffsets = CodeOffsets {
        filename: 16,
        name: 24,
        qualname: Some(32),
    };

    /// A code object at `word` with strings after it (uses words `word..word+40`).
    fn fake_code(f: &mut Fake, word: usize, qualname: &str, line: u32) {
        let t = f.addr(CODE_TYPE_WORD);
        f.set(word + 1, t);
        let (file, name) = (word + 10, word + 25);
        f.set(word + 2, f.addr(file));
        f.set(word + 3, f.addr(name));
        f.set(word + 4, f.addr(name));
        f.set(word + 8, u64::from(line) << 32); // co_firstlineno at 68
        f.str_at(file, "/x/train.py");
        f.str_at(name, qualname);
    }

    /// A 3.12 `_PyInterpreterFrame` at `word`: code at 0, previous at 8, owner at 70.
    fn fake_frame(f: &mut Fake, word: usize, code: u64, previous: u64, owner: u8) {
        f.set(word, code);
        f.set(word + 1, previous);
        f.set_byte(word + 8, 6, owner);
    }

    fn reader(f: &Fake) -> StackReader {
        StackReader::new(
            v(12),
            CODE_OFFSETS,
            python::frame_layout(v(12)).unwrap(),
            f.addr(CODE_TYPE_WORD),
        )
        .unwrap()
    }

    #[test]
    fn walks_a_fake_312_stack() {
        let mut f = Fake::new();
        fake_code(&mut f, 100, "outer", 10);
        fake_code(&mut f, 200, "Klass.middle", 20);
        fake_code(&mut f, 300, "inner", 30);
        // Frames at 1000.. (innermost 1000): inner <- shim <- non-code <- middle <- outer.
        let (c_out, c_mid, c_in) = (f.addr(100), f.addr(200), f.addr(300));
        let not_code = f.addr(50); // ob_type is 0
        let fr = |i: usize| 1000 + 10 * i;
        let a = |f: &Fake, i: usize| f.addr(fr(i));
        let (f1, f2, f3, f4) = (a(&f, 1), a(&f, 2), a(&f, 3), a(&f, 4));
        fake_frame(&mut f, fr(0), c_in, f1, 0);
        fake_frame(&mut f, fr(1), c_in, f2, 3); // shim: skipped although its code is valid
        fake_frame(&mut f, fr(2), not_code, f3, 0);
        fake_frame(&mut f, fr(3), c_mid, f4, 0);
        fake_frame(&mut f, fr(4), c_out, 0, 0);
        // tstate at 2000 -> cframe (at 2100) -> current_frame
        let cframe = f.addr(2100);
        f.set(2000 + 56 / 8, cframe);
        f.set(2100, a(&f, 0));

        let mem = TargetMemory::new(std::process::id());
        let mut r = reader(&f);
        let stack = r.read(&mem, f.addr(2000)).unwrap();
        let names: Vec<(&str, &str, u32)> = stack
            .frames
            .iter()
            .map(|p| (&*p.function, &*p.file, p.line))
            .collect();
        assert_eq!(
            names,
            [
                ("outer", "/x/train.py", 10),
                ("Klass.middle", "/x/train.py", 20),
                ("inner", "/x/train.py", 30)
            ]
        );
        assert!(!stack.truncated);
        assert_eq!(r.cache.len(), 3);
        // Cached: the same answer again.
        assert_eq!(r.read(&mem, f.addr(2000)).unwrap(), stack);

        // A cycle (outer's frame points back at inner's) is an error, not a loop.
        f.set(fr(4) + 1, a(&f, 0));
        assert!(matches!(
            r.read(&mem, f.addr(2000)),
            Err(StackError::Cycle { .. })
        ));
        // A misaligned link is an error.
        f.set(fr(4) + 1, a(&f, 0) + 3);
        assert!(matches!(
            r.read(&mem, f.addr(2000)),
            Err(StackError::BadFrame { .. })
        ));
        // An unreadable link is an error.
        f.set(fr(4) + 1, 8);
        assert!(matches!(
            r.read(&mem, f.addr(2000)),
            Err(StackError::Mem(_))
        ));
        // No frame: an empty stack.
        f.set(2100, 0);
        assert_eq!(r.read(&mem, f.addr(2000)).unwrap(), Stack::default());
        assert!(matches!(
            r.read(&mem, 0),
            Err(StackError::BadThreadState { .. })
        ));
        // Pointers past user space are refused before any arithmetic on them.
        f.set(2100, u64::MAX - 7);
        assert!(matches!(
            r.read(&mem, f.addr(2000)),
            Err(StackError::BadFrame { .. })
        ));
        f.set(2100, a(&f, 0));
        f.set(fr(4) + 1, 0);
        f.set(fr(0), u64::MAX - 7); // inner's code pointer: that frame is skipped
        let names: Vec<String> = r
            .read(&mem, f.addr(2000))
            .unwrap()
            .frames
            .iter()
            .map(|p| p.function.to_string())
            .collect();
        assert_eq!(names, ["outer", "Klass.middle"]);
    }

    #[test]
    fn deep_stacks_are_truncated_to_the_innermost_frames() {
        let mut f = Fake::new();
        fake_code(&mut f, 100, "recurse", 5);
        let code = f.addr(100);
        // 200 frames of 2 words each from word 1000: frame i links to i+1.
        let n = 200;
        for i in 0..n {
            let next = if i + 1 < n {
                f.addr(1000 + 10 * (i + 1))
            } else {
                0
            };
            fake_frame(&mut f, 1000 + 10 * i, code, next, 0);
        }
        let cframe = f.addr(3500);
        f.set(3400 + 56 / 8, cframe);
        f.set(3500, f.addr(1000));
        let mem = TargetMemory::new(std::process::id());
        let stack = reader(&f).read(&mem, f.addr(3400)).unwrap();
        assert_eq!(stack.frames.len(), MAX_DEPTH);
        assert!(stack.truncated);
    }

    #[test]
    fn cache_is_bounded() {
        let mut f = Fake::new();
        fake_code(&mut f, 100, "f", 1);
        let mem = TargetMemory::new(std::process::id());
        let mut r = reader(&f);
        for i in 0..CACHE_LIMIT as u64 {
            let frame = PyFrame {
                function: "x".into(),
                file: "y".into(),
                line: 0,
            };
            // Line tables live with their code object's names, and go with them.
            let table = Some(Some(Arc::from(&[1u8, 2][..])));
            r.cache
                .insert(1_000_000 + 8 * i, CachedCode { frame, table });
        }
        // Full: the next new code object empties the cache first, its tables with it.
        assert_eq!(&*r.code(&mem, f.addr(100)).unwrap().unwrap().function, "f");
        assert_eq!(r.cache.len(), 1);
        assert!(r.cache.values().all(|c| c.table.is_none()));
    }

    #[test]
    fn main_thread_in_a_fake_runtime() {
        let mut f = Fake::new();
        let o = stack_offsets(v(12)).unwrap();
        // runtime at word 0 (offsets 64, 48), interp at 100, tstates at 200 and 300.
        let (rt, interp, t1, t2) = (0, 100, 200, 300);
        f.set(rt + o.runtime_main_thread as usize / 8, 0xabc);
        f.set(rt + o.runtime_interp_main as usize / 8, f.addr(interp));
        f.set(interp + o.interp_threads_head as usize / 8, f.addr(t1));
        f.set(t1 + o.tstate_thread_id as usize / 8, 0x123);
        f.set(t1 + o.tstate_next as usize / 8, f.addr(t2));
        f.set(t2 + o.tstate_thread_id as usize / 8, 0xabc);
        let mem = TargetMemory::new(std::process::id());
        let r = reader(&f);
        assert_eq!(r.main_thread(&mem, f.addr(rt)).unwrap(), f.addr(t2));
        f.set(t2 + o.tstate_thread_id as usize / 8, 0x999);
        assert!(matches!(
            r.main_thread(&mem, f.addr(rt)),
            Err(StackError::NoMainThread { .. })
        ));
    }
}
