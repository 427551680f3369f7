//! The names of operator state in a checkpoint, typed. Every operator
//! declares its state as [`StateEntry`] values; their text form (in the
//! checkpoint header) is written and parsed here and nowhere else.

use crate::error::{EngineError, Result};

/// One state table entry of an operator snapshot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StateEntry {
    /// The one keyed state of a continuous query: `state`.
    Groups,
    /// Session windows, one row each: `sessions`.
    Sessions,
    /// The kept rows of a top-N, one row each: `ranks`.
    Ranks,
    /// An aggregation over an aggregation: the outer groups, `regroups`
    /// (the inner ones are [`StateEntry::Groups`]). `folded` held the inner
    /// result rows folded into them in checkpoints of older builds, which
    /// are refused.
    Folded,
    Regroups,
    /// The keyed state of an open window, by start: `open/<start>`.
    Open(i64),
    /// A closed window kept for late rows, by start: `closed/<start>`.
    Closed(i64),
    /// Rows waiting for the watermark to pass `tick`, the `seq`-th part
    /// queued for it, read from `partition`: `pending/<tick>/<seq>/<partition>`.
    Pending {
        tick: i64,
        seq: usize,
        partition: u32,
    },
    /// The rows a join holds for one side (0 left, 1 right): `join/<side>`.
    JoinSide(u8),
    /// State of the aggregation a join side reads: `side/<side>/<entry>`.
    Side(u8, Box<StateEntry>),
    /// The current rows of a changelog source, by primary key: `table`.
    Table,
}

impl StateEntry {
    pub fn name(&self) -> String {
        match self {
            StateEntry::Groups => "state".into(),
            StateEntry::Sessions => "sessions".into(),
            StateEntry::Ranks => "ranks".into(),
            StateEntry::Folded => "folded".into(),
            StateEntry::Regroups => "regroups".into(),
            StateEntry::Open(start) => format!("open/{start}"),
            StateEntry::Closed(start) => format!("closed/{start}"),
            StateEntry::Pending {
                tick,
                seq,
                partition,
            } => format!("pending/{tick}/{seq}/{partition}"),
            StateEntry::JoinSide(side) => format!("join/{side}"),
            StateEntry::Side(side, inner) => format!("side/{side}/{}", inner.name()),
            StateEntry::Table => "table".into(),
        }
    }

    pub fn parse(name: &str) -> Result<Self> {
        let bad = || EngineError::Checkpoint(format!("unknown state entry {name:?}"));
        let num = |s: &str| s.parse::<i64>().map_err(|_| bad());
        if let Some(rest) = name.strip_prefix("side/") {
            let (side, inner) = rest.split_once('/').ok_or_else(bad)?;
            return Ok(StateEntry::Side(
                side.parse().map_err(|_| bad())?,
                Box::new(Self::parse(inner)?),
            ));
        }
        let parts: Vec<&str> = name.split('/').collect();
        Ok(match parts.as_slice() {
            ["state"] => StateEntry::Groups,
            ["table"] => StateEntry::Table,
            ["sessions"] => StateEntry::Sessions,
            ["ranks"] => StateEntry::Ranks,
            ["folded"] => StateEntry::Folded,
            ["regroups"] => StateEntry::Regroups,
            ["open", start] => StateEntry::Open(num(start)?),
            ["closed", start] => StateEntry::Closed(num(start)?),
            // Windowed queries of format 1 wrote no partition (their late rows are not sorted by it).
            ["pending", tick, seq] => StateEntry::Pending {
                tick: num(tick)?,
                seq: seq.parse().map_err(|_| bad())?,
                partition: 0,
            },
            ["pending", tick, seq, partition] => StateEntry::Pending {
                tick: num(tick)?,
                seq: seq.parse().map_err(|_| bad())?,
                partition: partition.parse().map_err(|_| bad())?,
            },
            ["join", side] => StateEntry::JoinSide(side.parse().map_err(|_| bad())?),
            _ => return Err(bad()),
        })
    }

    /// The error for an entry an operator does not hold.
    pub fn unexpected(&self, operator: &str) -> EngineError {
        EngineError::Checkpoint(format!(
            "state entry {:?} does not belong to a {operator} operator",
            self.name()
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for e in [
            StateEntry::Groups,
            StateEntry::Sessions,
            StateEntry::Ranks,
            StateEntry::Folded,
            StateEntry::Regroups,
            StateEntry::Open(-60_000_000),
            StateEntry::Closed(120),
            StateEntry::Pending {
                tick: 7,
                seq: 2,
                partition: 3,
            },
            StateEntry::JoinSide(1),
            StateEntry::Side(
                0,
                Box::new(StateEntry::Pending {
                    tick: 1,
                    seq: 0,
                    partition: 2,
                }),
            ),
        ] {
            assert_eq!(StateEntry::parse(&e.name()).unwrap(), e);
        }
        assert!(StateEntry::parse("pending/x/1").is_err());
        assert!(StateEntry::parse("other").is_err());
    }
}
