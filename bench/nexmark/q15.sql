-- Nexmark q15, bidding statistics report: per day, bids, bidders and
-- auctions in three price ranks (a continuous aggregation: each day's row
-- is upserted as bids come in).
-- Published (Flink):
--   SELECT DATE_FORMAT(dateTime, 'yyyy-MM-dd') as `day`,
--          count(*) AS total_bids,
--          count(*) filter (where price < 10000) AS rank1_bids, ... rank2, rank3,
--          count(distinct bidder) AS total_bidders,
--          count(distinct bidder) filter (where price < 10000) AS rank1_bidders, ...,
--          count(distinct auction) AS total_auctions,
--          count(distinct auction) filter (where price < 10000) AS rank1_auctions, ...
--   FROM bid GROUP BY DATE_FORMAT(dateTime, 'yyyy-MM-dd')
-- ubik: DATE_FORMAT(t, 'yyyy-MM-dd') is to_char(t, '%Y-%m-%d').
-- oracle: the query, in one shot
SELECT
     to_char(date_time, '%Y-%m-%d') AS day,
     count(*) AS total_bids,
     count(*) FILTER (WHERE price < 10000) AS rank1_bids,
     count(*) FILTER (WHERE price >= 10000 AND price < 1000000) AS rank2_bids,
     count(*) FILTER (WHERE price >= 1000000) AS rank3_bids,
     count(DISTINCT bidder) AS total_bidders,
     count(DISTINCT bidder) FILTER (WHERE price < 10000) AS rank1_bidders,
     count(DISTINCT bidder) FILTER (WHERE price >= 10000 AND price < 1000000) AS rank2_bidders,
     count(DISTINCT bidder) FILTER (WHERE price >= 1000000) AS rank3_bidders,
     count(DISTINCT auction) AS total_auctions,
     count(DISTINCT auction) FILTER (WHERE price < 10000) AS rank1_auctions,
     count(DISTINCT auction) FILTER (WHERE price >= 10000 AND price < 1000000) AS rank2_auctions,
     count(DISTINCT auction) FILTER (WHERE price >= 1000000) AS rank3_auctions
FROM bid
GROUP BY to_char(date_time, '%Y-%m-%d')
