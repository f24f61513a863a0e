//! The delivery tags of one consuming channel: which are unsettled, and whether one `multiple`
//! frame may settle a run of them.
//!
//! The broker numbers a channel's deliveries 1, 2, 3, … across every consumer on it, and a
//! `multiple` ack or nack settles every unsettled tag up to the one it names. `<queue>` and
//! `<queue>.dead` are consumed on one channel and merged into one stream, so a delivery of one
//! can wait in its buffer, unseen, while higher tags of the other are received and settled. A
//! `multiple` frame over it would settle a delivery nobody worked on: acked, a broker dead
//! letter would be gone without reaching the store's dead letters. So a `multiple` frame is sent
//! only up to a tag below which every tag has been received.

use std::collections::{BTreeSet, HashMap};

#[derive(Debug, Default)]
pub(super) struct ChannelTags {
    /// Received and not yet settled (a tag is removed once its frame went out).
    unsettled: BTreeSet<u64>,
    /// Every tag from 1 up to this one has been received.
    received_through: u64,
    /// Tags received above a gap: a lower delivery is still in a stream buffer.
    received_above: BTreeSet<u64>,
    /// The deliveries that ended unsettled before, of each unsettled tag that has any (what an
    /// unhandled give-back's copy carries on).
    returned: HashMap<u64, u32>,
}

impl ChannelTags {
    /// Records a delivery handed to the consumer.
    #[cfg(test)]
    pub(super) fn received(&mut self, tag: u64) {
        self.received_returned(tag, 0);
    }

    /// Records a delivery handed to the consumer, whose message ended unsettled `returned`
    /// times before.
    pub(super) fn received_returned(&mut self, tag: u64, returned: u32) {
        if returned > 0 {
            self.returned.insert(tag, returned);
        }
        self.unsettled.insert(tag);
        if tag == self.received_through + 1 {
            self.received_through = tag;
            while self.received_above.remove(&(self.received_through + 1)) {
                self.received_through += 1;
            }
        } else if tag > self.received_through {
            self.received_above.insert(tag);
        }
    }

    /// Of `tags`, those still unsettled on this channel, sorted, without repeats.
    pub(super) fn unsettled_of(&self, tags: impl IntoIterator<Item = u64>) -> Vec<u64> {
        let mut mine: Vec<u64> = tags
            .into_iter()
            .filter(|tag| self.unsettled.contains(tag))
            .collect();
        mine.sort_unstable();
        mine.dedup();
        mine
    }

    /// Whether one `multiple` frame naming the last of `mine` (sorted, unsettled) settles
    /// exactly `mine`: every tag up to it was received, and the unsettled ones are `mine`.
    pub(super) fn one_frame_settles_exactly(&self, mine: &[u64]) -> bool {
        let Some(&last) = mine.last() else {
            return false;
        };
        last <= self.received_through
            && self
                .unsettled
                .range(..=last)
                .copied()
                .eq(mine.iter().copied())
    }

    /// Forgets tags whose frames went out.
    /// Whether `tag` is unsettled, and how many deliveries of its message ended unsettled
    /// before it.
    pub(super) fn unsettled_returned(&self, tag: u64) -> Option<u32> {
        self.unsettled
            .contains(&tag)
            .then(|| self.returned.get(&tag).copied().unwrap_or(0))
    }

    pub(super) fn settled(&mut self, tags: &[u64]) {
        for tag in tags {
            self.unsettled.remove(tag);
            self.returned.remove(tag);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn received(tags: &[u64]) -> ChannelTags {
        let mut channel = ChannelTags::default();
        for &tag in tags {
            channel.received(tag);
        }
        channel
    }

    #[test]
    fn a_contiguous_run_of_every_unsettled_tag_is_one_frame() {
        let channel = received(&[1, 2, 3, 4]);
        assert!(channel.one_frame_settles_exactly(&[1, 2, 3, 4]));
        assert!(channel.one_frame_settles_exactly(&[1, 2]));
    }

    #[test]
    fn a_run_with_another_workers_tag_below_its_last_is_single_frames() {
        let channel = received(&[1, 2, 3, 4]);
        assert!(!channel.one_frame_settles_exactly(&[2, 3, 4]));
        assert!(!channel.one_frame_settles_exactly(&[1, 3]));
    }

    #[test]
    fn a_tag_not_yet_received_below_the_run_is_never_covered() {
        // Tag 3 (say, a `<queue>.dead` delivery) is still in its stream's buffer.
        let mut channel = received(&[1, 2, 4, 5]);
        assert!(!channel.one_frame_settles_exactly(&[1, 2, 4, 5]));
        assert!(channel.one_frame_settles_exactly(&[1, 2]));
        channel.received(3);
        assert!(channel.one_frame_settles_exactly(&[1, 2, 3, 4, 5]));
    }

    #[test]
    fn settled_tags_leave_the_run_below_them_free() {
        let mut channel = received(&[1, 2, 3]);
        channel.settled(&[1, 2]);
        channel.received(4);
        assert_eq!(channel.unsettled_of([3, 4, 9]), vec![3, 4]);
        assert!(channel.one_frame_settles_exactly(&[3, 4]));
    }

    #[test]
    fn a_returned_count_is_kept_while_unsettled() {
        let mut channel = ChannelTags::default();
        channel.received_returned(1, 3);
        channel.received(2);
        assert_eq!(channel.unsettled_returned(1), Some(3));
        assert_eq!(channel.unsettled_returned(2), Some(0));
        channel.settled(&[1]);
        assert_eq!(channel.unsettled_returned(1), None);
    }
}
