-- Nexmark q17, auction statistics report: per auction and day, bids in
-- three price ranks and price statistics (a continuous aggregation).
-- Published (Flink):
--   SELECT auction, DATE_FORMAT(dateTime, 'yyyy-MM-dd') as `day`,
--          count(*) AS total_bids,
--          count(*) filter (where price < 10000) AS rank1_bids,
--          count(*) filter (where price >= 10000 and price < 1000000) AS rank2_bids,
--          count(*) filter (where price >= 1000000) AS rank3_bids,
--          min(price) AS min_price, max(price) AS max_price,
--          avg(price) AS avg_price, sum(price) AS sum_price
--   FROM bid GROUP BY auction, DATE_FORMAT(dateTime, 'yyyy-MM-dd')
-- ubik: DATE_FORMAT(t, 'yyyy-MM-dd') is to_char(t, '%Y-%m-%d').
-- oracle: the query, in one shot
SELECT
     auction,
     to_char(date_time, '%Y-%m-%d') AS day,
     count(*) AS total_bids,
     count(*) FILTER (WHERE price < 10000) AS rank1_bids,
     count(*) FILTER (WHERE price >= 10000 AND price < 1000000) AS rank2_bids,
     count(*) FILTER (WHERE price >= 1000000) AS rank3_bids,
     min(price) AS min_price,
     max(price) AS max_price,
     avg(price) AS avg_price,
     sum(price) AS sum_price
FROM bid
GROUP BY auction, to_char(date_time, '%Y-%m-%d')
