//! The host: what the daemon reads of the node and its processes (`/proc`, users through the
//! system's name service, who a process is, the service's policy, which processes make one
//! job, how a target ended) and where it writes (output files no planted link can redirect).
//! Nothing here reads the event stream or the model; the runtime above takes it from here.

pub mod ending;
pub mod identity;
pub mod jobs;
pub mod output;
pub mod policy;
pub mod procinfo;
pub mod reads;
pub mod users;
