-- Nexmark q18, find last bid: the latest bid of each bidder on each auction.
-- Published (Flink):
--   SELECT auction, bidder, price, channel, url, dateTime, extra
--   FROM (SELECT *, ROW_NUMBER() OVER (PARTITION BY bidder, auction ORDER BY dateTime DESC) AS rank_number
--         FROM bid)
--   WHERE rank_number <= 1
-- ubik: as published. The changelog is keyed by (bidder, auction) and
-- upserts a key when a later bid replaces its row. Bids of one bidder on
-- one auction at the same instant are told apart by their other columns
-- (ascending), so the kept row never depends on arrival order.
-- oracle: SELECT auction, bidder, price, channel, url, date_time, extra
-- oracle: FROM (SELECT *, ROW_NUMBER() OVER (PARTITION BY bidder, auction
-- oracle:   ORDER BY date_time DESC, auction, bidder, price, channel, url, date_time, extra) AS rank_number FROM bid)
-- oracle: WHERE rank_number <= 1
SELECT auction, bidder, price, channel, url, date_time, extra
FROM (SELECT *, ROW_NUMBER() OVER (PARTITION BY bidder, auction ORDER BY date_time DESC) AS rank_number
      FROM bid)
WHERE rank_number <= 1
