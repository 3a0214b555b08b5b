//! Why a command failed, as a type: each variant has its exit status (the `--help` text lists
//! them) and its message is one sentence for the user.

/// A command's failure.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Bad arguments, or an input or output file that cannot be used: 2.
    #[error("{0}")]
    Usage(String),
    /// The target cannot be profiled (no such pid, not Python): 3.
    #[error("{0}")]
    Target(String),
    /// Missing privileges or kernel support: 4.
    #[error("{0}")]
    Unsupported(String),
    /// The live attach failed: 3 (target), 4 (privileges, kernel) or 1, by its kind.
    #[cfg(feature = "live")]
    #[error(transparent)]
    Live(#[from] crate::runtime::target::LiveError),
    /// `serve` could not start: 2 (settings, state directory, metrics address), 4, or 1.
    #[cfg(feature = "live")]
    #[error(transparent)]
    Serve(#[from] crate::runtime::serve::ServeError),
    /// Anything else: 1.
    #[error("{0}")]
    Unexpected(String),
}

impl Error {
    /// [`Error::Usage`] with `e`'s message.
    pub fn usage(e: impl std::fmt::Display) -> Error {
        Error::Usage(e.to_string())
    }

    /// [`Error::Unexpected`] with `e`'s message.
    pub fn unexpected(e: impl std::fmt::Display) -> Error {
        Error::Unexpected(e.to_string())
    }

    /// The process's exit status for this failure.
    pub fn exit_code(&self) -> u8 {
        match self {
            Error::Usage(_) => 2,
            Error::Target(_) => 3,
            Error::Unsupported(_) => 4,
            #[cfg(feature = "live")]
            Error::Live(e) => u8::try_from(e.exit_code()).unwrap_or(1),
            #[cfg(feature = "live")]
            Error::Serve(e) => e.exit_code(),
            Error::Unexpected(_) => 1,
        }
    }
}

impl From<anyhow::Error> for Error {
    fn from(e: anyhow::Error) -> Self {
        Error::Unexpected(format!("{e:#}"))
    }
}

#[cfg(test)]
mod tests {
    use super::Error;

    #[test]
    fn each_kind_has_its_exit_status() {
        assert_eq!(Error::Usage("x".into()).exit_code(), 2);
        assert_eq!(Error::Target("x".into()).exit_code(), 3);
        assert_eq!(Error::Unsupported("x".into()).exit_code(), 4);
        assert_eq!(Error::Unexpected("x".into()).exit_code(), 1);
        assert_eq!(Error::from(anyhow::anyhow!("boom")).exit_code(), 1);
    }
}
