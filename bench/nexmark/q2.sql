-- Nexmark q2, selection: the bids on a few auctions.
-- Published (Flink): SELECT auction, price FROM bid WHERE MOD(auction, 123) = 0
-- ubik: as published; % is MOD.
-- oracle: SELECT auction, price FROM bid WHERE auction % 123 = 0
SELECT auction, price FROM bid WHERE auction % 123 = 0
