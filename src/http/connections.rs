//! How many connections the server holds open: the process's file-descriptor limit and the
//! per-worker share of `limits.max_connections`.

/// Descriptors kept free of connections (a quarter of the limit, at most this many): the store's
/// files and log segments, the runtimes' event queues, agents' pipes and outbound sockets.
const RESERVED_FDS: libc::rlim_t = 256;

fn reserved(soft: libc::rlim_t) -> libc::rlim_t {
    RESERVED_FDS.min(soft / 4)
}

fn read_limit() -> std::io::Result<libc::rlimit> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes into the struct we own and pass by pointer.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(limit)
}

/// Raises the soft RLIMIT_NOFILE to the hard limit (an ordinary soft limit of 1024 is used up
/// by a few hundred clients) and logs both. Returns the soft limit now in force, `None` when the
/// limit cannot be read.
pub fn raise_open_files_limit() -> Option<libc::rlim_t> {
    let mut limit = match read_limit() {
        Ok(limit) => limit,
        Err(error) => {
            tracing::warn!(%error, "cannot read the open-files limit (RLIMIT_NOFILE)");
            return None;
        }
    };
    let before = limit.rlim_cur;
    if limit.rlim_cur < limit.rlim_max {
        let raised = libc::rlimit {
            rlim_cur: limit.rlim_max,
            rlim_max: limit.rlim_max,
        };
        // SAFETY: setrlimit reads the struct we pass by pointer.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } == 0 {
            limit = raised;
        } else {
            let error = std::io::Error::last_os_error();
            tracing::warn!(%error, soft = before, hard = limit.rlim_max,
                "cannot raise the soft open-files limit to the hard limit");
        }
    }
    let (soft, hard) = (limit.rlim_cur, limit.rlim_max);
    tracing::info!(
        soft,
        hard,
        soft_at_start = before,
        "open-files limit (RLIMIT_NOFILE)"
    );
    Some(soft)
}

/// Each worker's share of `max_connections` (actix counts connections per worker), after
/// keeping the total within the descriptors the process may open.
pub fn per_worker(
    max_connections: usize,
    workers: usize,
    open_files: Option<libc::rlim_t>,
) -> usize {
    let usable = open_files
        .map(|soft| soft.saturating_sub(reserved(soft)).max(1))
        .map_or(usize::MAX, |n| usize::try_from(n).unwrap_or(usize::MAX));
    let total = if max_connections > usable {
        tracing::warn!(
            max_connections,
            allowed = usable,
            "limits.max_connections is more than the open-files limit allows; using the lower bound"
        );
        usable
    } else {
        max_connections
    };
    total.div_ceil(workers.max(1)).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_round_up_and_respect_the_descriptor_limit() {
        assert_eq!(per_worker(10, 4, None), 3);
        assert_eq!(per_worker(1, 4, None), 1);
        let files = Some(1024);
        assert_eq!(per_worker(10_000, 2, files), 384);
        assert_eq!(per_worker(100, 2, files), 50);
        // A small limit keeps three quarters for connections.
        assert_eq!(per_worker(10_000, 1, Some(256)), 192);
    }
}
