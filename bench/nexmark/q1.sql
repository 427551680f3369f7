-- Nexmark q1, currency conversion: each bid's price in euros.
-- Published (Flink): SELECT auction, bidder, 0.908 * price as price, dateTime, extra FROM bid
-- ubik: as published (snake_case columns); 0.908 * price is a DOUBLE.
-- oracle: SELECT auction, bidder, 0.908 * price AS price, date_time, extra FROM bid
SELECT auction, bidder, 0.908 * price AS price, date_time, extra FROM bid
