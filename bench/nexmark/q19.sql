-- Nexmark q19, auction top-10 price: the ten highest bids of each auction.
-- Published (Flink):
--   SELECT * FROM
--   (SELECT *, ROW_NUMBER() OVER (PARTITION BY auction ORDER BY price DESC) AS rank_number FROM bid)
--   WHERE rank_number <= 10
-- ubik: as published. The changelog is keyed by (auction, rank_number):
-- a new bid among the ten upserts its rank and every rank below it. Equal
-- prices are told apart by the bids' other columns (ascending).
-- oracle: SELECT * FROM (SELECT *, ROW_NUMBER() OVER (PARTITION BY auction
-- oracle:   ORDER BY price DESC, auction, bidder, price, channel, url, date_time, extra) AS rank_number FROM bid)
-- oracle: WHERE rank_number <= 10
SELECT * FROM
(SELECT *, ROW_NUMBER() OVER (PARTITION BY auction ORDER BY price DESC) AS rank_number FROM bid)
WHERE rank_number <= 10
