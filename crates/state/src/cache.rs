//! A byte-bounded cache of decoded blocks, evicted by CLOCK (second
//! chance): a hit sets a slot's reference bit, and the hand clears bits
//! until it finds a slot to evict. Cheaper per hit than a strict LRU list,
//! and as good for the skewed access state sees.

use std::sync::Arc;

use hashbrown::HashMap;

use crate::run::Block;

/// (run id, block number).
pub type BlockKey = (u64, u32);

struct Slot {
    key: BlockKey,
    block: Arc<Block>,
    referenced: bool,
}

pub struct BlockCache {
    capacity: usize,
    bytes: usize,
    slots: Vec<Slot>,
    index: HashMap<BlockKey, usize>,
    hand: usize,
    pub hits: u64,
    pub misses: u64,
}

impl BlockCache {
    pub fn new(capacity: usize) -> Self {
        Self {
            capacity,
            bytes: 0,
            slots: Vec::new(),
            index: HashMap::new(),
            hand: 0,
            hits: 0,
            misses: 0,
        }
    }

    pub fn get(&mut self, key: BlockKey) -> Option<Arc<Block>> {
        match self.index.get(&key) {
            Some(&i) => {
                self.hits += 1;
                self.slots[i].referenced = true;
                Some(Arc::clone(&self.slots[i].block))
            }
            None => {
                self.misses += 1;
                None
            }
        }
    }

    pub fn insert(&mut self, key: BlockKey, block: Arc<Block>) {
        let size = block.size();
        if size > self.capacity || self.index.contains_key(&key) {
            return;
        }
        while self.bytes + size > self.capacity && !self.slots.is_empty() {
            self.evict_one();
        }
        self.bytes += size;
        self.index.insert(key, self.slots.len());
        self.slots.push(Slot {
            key,
            block,
            referenced: false,
        });
    }

    fn evict_one(&mut self) {
        loop {
            if self.hand >= self.slots.len() {
                self.hand = 0;
            }
            let slot = &mut self.slots[self.hand];
            if slot.referenced {
                slot.referenced = false;
                self.hand += 1;
                continue;
            }
            let victim = self.slots.swap_remove(self.hand);
            self.index.remove(&victim.key);
            if let Some(moved) = self.slots.get(self.hand) {
                self.index.insert(moved.key, self.hand);
            }
            self.bytes -= victim.block.size();
            return;
        }
    }

    /// Drops every block of `run` (its file is gone).
    pub fn forget_run(&mut self, run: u64) {
        let mut i = 0;
        while i < self.slots.len() {
            if self.slots[i].key.0 == run {
                let victim = self.slots.swap_remove(i);
                self.index.remove(&victim.key);
                self.bytes -= victim.block.size();
                if let Some(moved) = self.slots.get(i) {
                    self.index.insert(moved.key, i);
                }
            } else {
                i += 1;
            }
        }
    }

    pub fn size(&self) -> usize {
        self.bytes
    }
}
