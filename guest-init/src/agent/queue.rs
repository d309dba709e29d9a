//! A FIFO of bytes written out in pieces: the frames waiting for the vsock
//! and the stdin waiting for the command. It has no limit of its own; the
//! relay stops filling a queue once it holds `limit` bytes, which bounds it
//! to the limit plus one fill. Pure, unit-tested.

#[derive(Debug, Default)]
pub struct ByteQueue {
    buf: Vec<u8>,
    /// Bytes of `buf` already written out.
    done: usize,
}

impl ByteQueue {
    pub fn new() -> Self {
        ByteQueue::default()
    }

    pub fn push(&mut self, bytes: &[u8]) {
        if self.done == self.buf.len() {
            self.buf.clear();
            self.done = 0;
        }
        self.buf.extend_from_slice(bytes);
    }

    /// What is still to be written, oldest first.
    pub fn pending(&self) -> &[u8] {
        &self.buf[self.done..]
    }

    /// Marks `n` bytes of `pending()` as written.
    pub fn consume(&mut self, n: usize) {
        self.done = (self.done + n).min(self.buf.len());
        if self.done == self.buf.len() {
            self.buf.clear();
            self.done = 0;
        } else if self.done > self.buf.len() / 2 {
            // Keep the copy cost proportional to what was written.
            self.buf.drain(..self.done);
            self.done = 0;
        }
    }

    pub fn len(&self) -> usize {
        self.buf.len() - self.done
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Forgets everything pending (its reader is gone).
    pub fn clear(&mut self) {
        self.buf.clear();
        self.done = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fifo_in_pieces() {
        let mut q = ByteQueue::new();
        assert!(q.is_empty());
        q.push(b"hello ");
        q.push(b"world");
        assert_eq!(q.pending(), b"hello world");
        q.consume(3);
        assert_eq!(q.pending(), b"lo world");
        assert_eq!(q.len(), 8);
        q.push(b"!");
        q.consume(7);
        assert_eq!(q.pending(), b"d!");
        q.consume(2);
        assert!(q.is_empty());
        assert_eq!(q.pending(), b"");
    }

    #[test]
    fn consume_more_than_pending_is_harmless() {
        let mut q = ByteQueue::new();
        q.push(b"ab");
        q.consume(10);
        assert!(q.is_empty());
        q.push(b"c");
        assert_eq!(q.pending(), b"c");
    }

    #[test]
    fn written_bytes_are_released() {
        let mut q = ByteQueue::new();
        q.push(&[1; 1000]);
        q.consume(600);
        assert_eq!(q.buf.len(), 400, "compacted past half");
        q.clear();
        assert!(q.is_empty());
    }
}
