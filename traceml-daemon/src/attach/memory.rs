//! Reading the target's memory (`process_vm_readv`), for code objects and `PyCode_Type`.

#[derive(Debug, thiserror::Error)]
pub enum MemError {
    #[error("cannot read {len} bytes at {addr:#x} in process {pid}: {source}")]
    Read {
        pid: u32,
        addr: u64,
        len: usize,
        source: std::io::Error,
    },
    #[error("short read of {len} bytes at {addr:#x} in process {pid}")]
    Short { pid: u32, addr: u64, len: usize },
}

/// A handle on another process's memory.
#[derive(Clone, Debug)]
pub struct TargetMemory {
    pid: u32,
}

impl TargetMemory {
    pub fn new(pid: u32) -> Self {
        TargetMemory { pid }
    }

    pub fn pid(&self) -> u32 {
        self.pid
    }

    pub fn read(&self, addr: u64, buf: &mut [u8]) -> Result<(), MemError> {
        let local = libc::iovec {
            iov_base: buf.as_mut_ptr().cast(),
            iov_len: buf.len(),
        };
        let remote = libc::iovec {
            iov_base: addr as *mut libc::c_void,
            iov_len: buf.len(),
        };
        // SAFETY: `local` describes `buf`, which outlives the call; the remote side is only read
        // by the kernel, which checks it.
        let n =
            unsafe { libc::process_vm_readv(self.pid as libc::pid_t, &local, 1, &remote, 1, 0) };
        if n < 0 {
            return Err(MemError::Read {
                pid: self.pid,
                addr,
                len: buf.len(),
                source: std::io::Error::last_os_error(),
            });
        }
        if n as usize != buf.len() {
            return Err(MemError::Short {
                pid: self.pid,
                addr,
                len: buf.len(),
            });
        }
        Ok(())
    }

    pub fn read_u64(&self, addr: u64) -> Result<u64, MemError> {
        let mut b = [0u8; 8];
        self.read(addr, &mut b)?;
        Ok(u64::from_le_bytes(b))
    }

    pub fn read_u32(&self, addr: u64) -> Result<u32, MemError> {
        let mut b = [0u8; 4];
        self.read(addr, &mut b)?;
        Ok(u32::from_le_bytes(b))
    }

    /// A NUL-terminated string of at most `max` bytes (read byte-wise in small chunks so a string
    /// near the end of a mapping does not fail the read).
    pub fn read_cstr(&self, addr: u64, max: usize) -> Result<String, MemError> {
        let mut out = Vec::new();
        let mut chunk = [0u8; 16];
        while out.len() < max {
            let at = addr + out.len() as u64;
            // stay within one page per read
            let room = (4096 - (at % 4096)) as usize;
            let n = room.min(chunk.len());
            self.read(at, &mut chunk[..n])?;
            if let Some(z) = chunk[..n].iter().position(|&b| b == 0) {
                out.extend_from_slice(&chunk[..z]);
                break;
            }
            out.extend_from_slice(&chunk[..n]);
        }
        Ok(String::from_utf8_lossy(&out).into_owned())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_own_memory() {
        let value: u64 = 0x1122_3344_5566_7788;
        let text = b"hello\0world";
        let mem = TargetMemory::new(std::process::id());
        assert_eq!(mem.read_u64(&value as *const u64 as u64).unwrap(), value);
        assert_eq!(mem.read_cstr(text.as_ptr() as u64, 64).unwrap(), "hello");
        assert!(mem.read_u64(8).is_err());
    }
}
