-- Nexmark q0, pass-through: every bid, unchanged (measures the source,
-- the engine's plumbing and the sink).
-- Published (Flink): SELECT auction, bidder, price, dateTime, extra FROM bid
-- ubik: columns are snake_case (date_time), as in RisingWave's and Feldera's Nexmark.
-- oracle: SELECT auction, bidder, price, date_time, extra FROM bid
SELECT auction, bidder, price, date_time, extra FROM bid
