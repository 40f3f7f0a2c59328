//! The reads of the operator console (`http::console`): every principal's conversations newest
//! first, and the held leases. Each read is bounded: a listing page reads at most
//! [`EXAMINED_PER_PRINCIPAL`] index entries of each of at most [`MAX_PRINCIPALS`] principals.

use super::records::{CONVERSATIONS_BY_PRINCIPAL, Records};
use crate::store::{
    ConversationFilter, ConversationKey, ConversationMeta, HeldLease, KEY_LEN, Page, PrincipalKey,
    StoreResult, page_token,
};
use std::ops::Bound;

/// Principals a listing of every principal merges, at most: the index is ordered by principal
/// first, so a listing across them merges one newest-first run per principal.
pub const MAX_PRINCIPALS: usize = 1000;

/// Index entries one page reads of each principal's run, at most (entries a filter turns down
/// count too: a page may come back short, with a token that goes on from there).
pub const EXAMINED_PER_PRINCIPAL: usize = 512;

/// What one principal's run gave a page: its matches (their order key after the principal's
/// prefix, and the conversation) and, unless the run ended, the last order key read.
struct Run {
    matches: Vec<(Vec<u8>, ConversationMeta)>,
    frontier: Option<Vec<u8>>,
}

/// One page of the conversations `filter` keeps, newest first across principals.
///
/// Every principal's index entry is `l ++ principal key ++ !updated ms ++ conversation key`;
/// the part after the principal key orders conversations the same way whoever owns them, so
/// the runs merge by it, and the page token is that part of the last conversation passed.
/// A page goes no further than the earliest point where a run stopped reading (its frontier):
/// past it, that run's conversations are not known yet.
pub fn conversations(
    records: &Records,
    filter: &ConversationFilter,
) -> StoreResult<Page<ConversationMeta>> {
    let after = match filter.page_token.as_deref().filter(|t| !t.is_empty()) {
        Some(token) => {
            let (order, tail) = page_token::listing(token)?;
            Some([order.as_slice(), &tail].concat())
        }
        None => None,
    };
    let prefixes = match &filter.principal {
        Some(principal) => vec![principal_prefix(PrincipalKey::new(principal).as_bytes())],
        None => principal_prefixes(records)?,
    };
    let page_size = filter.page_size.max(1);
    let mut candidates = Vec::new();
    let mut frontier: Option<Vec<u8>> = None;
    for prefix in prefixes {
        let run = read_run(records, &prefix, after.as_deref(), filter, page_size)?;
        candidates.extend(run.matches);
        if let Some(stopped) = run.frontier
            && frontier.as_ref().is_none_or(|f| stopped < *f)
        {
            frontier = Some(stopped);
        }
    }
    if let Some(frontier) = &frontier {
        candidates.retain(|(order, _)| order <= frontier);
    }
    candidates.sort_by(|a, b| a.0.cmp(&b.0));
    let next_page_token = if candidates.len() > page_size {
        token_after(&candidates[page_size - 1].0)
    } else {
        frontier.as_deref().map(token_after).unwrap_or_default()
    };
    candidates.truncate(page_size);
    Ok(Page {
        items: candidates.into_iter().map(|(_, meta)| meta).collect(),
        next_page_token,
        total_size: 0,
    })
}

fn principal_prefix(principal_key: &[u8]) -> Vec<u8> {
    [&[CONVERSATIONS_BY_PRINCIPAL][..], principal_key].concat()
}

fn token_after(order: &[u8]) -> String {
    match order.split_first_chunk::<8>() {
        Some((ms, tail)) => page_token::for_listing(*ms, tail),
        None => String::new(),
    }
}

/// The principals that have conversations, found by skipping from one principal's entries to
/// the next (one seek per principal, not a read of every entry).
fn principal_prefixes(records: &Records) -> StoreResult<Vec<Vec<u8>>> {
    let mut prefixes = Vec::new();
    let mut from = vec![CONVERSATIONS_BY_PRINCIPAL];
    while prefixes.len() < MAX_PRINCIPALS {
        let mut scan = records
            .backend()
            .scan(Bound::Included(from), Bound::Unbounded, false);
        let Some(entry) = scan.next() else { break };
        let (key, _) = entry?;
        if key.first() != Some(&CONVERSATIONS_BY_PRINCIPAL) || key.len() < 1 + KEY_LEN {
            break;
        }
        let prefix = key[..1 + KEY_LEN].to_vec();
        match successor(&prefix) {
            Some(next) => from = next,
            None => {
                prefixes.push(prefix);
                break;
            }
        }
        prefixes.push(prefix);
    }
    Ok(prefixes)
}

/// The smallest key after every key that starts with `prefix`, if there is one.
fn successor(prefix: &[u8]) -> Option<Vec<u8>> {
    let mut next = prefix.to_vec();
    while let Some(last) = next.pop() {
        if last < u8::MAX {
            next.push(last + 1);
            return Some(next);
        }
    }
    None
}

/// Reads one principal's run after `after`: until it has one match more than a page, its
/// entries end, or [`EXAMINED_PER_PRINCIPAL`] were read.
fn read_run(
    records: &Records,
    prefix: &[u8],
    after: Option<&[u8]>,
    filter: &ConversationFilter,
    page_size: usize,
) -> StoreResult<Run> {
    let start = match after {
        Some(order) => Bound::Excluded([prefix, order].concat()),
        None => Bound::Included(prefix.to_vec()),
    };
    let mut run = Run {
        matches: Vec::new(),
        frontier: None,
    };
    let mut examined = 0;
    for entry in records.backend().scan(start, Bound::Unbounded, false) {
        let (key, _) = entry?;
        if !key.starts_with(prefix) {
            return Ok(run);
        }
        let order = key[prefix.len()..].to_vec();
        examined += 1;
        // An entry naming a key of another namespace version is not this version's to list.
        let meta = match order.get(8..).and_then(ConversationKey::from_bytes) {
            Some(conversation) => records.conversation(&conversation)?.map(|c| c.meta),
            None => None,
        };
        if let Some(meta) = meta.filter(|meta| filter.matches(meta)) {
            run.matches.push((order.clone(), meta));
        }
        if run.matches.len() > page_size || examined >= EXAMINED_PER_PRINCIPAL {
            run.frontier = Some(order);
            return Ok(run);
        }
    }
    Ok(run)
}

/// The conversations whose turn is running, from the index of running tasks (one process
/// holds them all: no holder, no expiry).
pub fn held_leases(records: &Records, limit: usize) -> StoreResult<Vec<HeldLease>> {
    let mut leases = Vec::new();
    for task_id in records.running_tasks()?.into_iter().take(limit) {
        if let Some(record) = records.task(&task_id)? {
            leases.push(HeldLease {
                principal: record.principal,
                context_id: record.task.context_id,
                task_id,
                holder: None,
                expires_in_secs: None,
            });
        }
    }
    Ok(leases)
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_successor_of_a_prefix_is_past_all_its_keys() {
        assert_eq!(super::successor(&[1, 2]), Some(vec![1, 3]));
        assert_eq!(super::successor(&[1, 255]), Some(vec![2]));
        assert_eq!(super::successor(&[255, 255]), None);
    }
}
