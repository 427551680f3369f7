-- Nexmark q16, channel statistics report: q15 per channel and day, with
-- the last minute (HH:mm) of the day a bid came in.
-- Published (Flink):
--   SELECT channel, DATE_FORMAT(dateTime, 'yyyy-MM-dd') as `day`,
--          max(DATE_FORMAT(dateTime, 'HH:mm')) as `minute`,
--          count(*) AS total_bids, ... (the counts of q15)
--   FROM bid GROUP BY channel, DATE_FORMAT(dateTime, 'yyyy-MM-dd')
-- ubik: DATE_FORMAT(t, 'yyyy-MM-dd') is to_char(t, '%Y-%m-%d'), 'HH:mm' is '%H:%M'.
-- oracle: the query, in one shot
SELECT
     channel,
     to_char(date_time, '%Y-%m-%d') AS day,
     max(to_char(date_time, '%H:%M')) AS minute,
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
GROUP BY channel, to_char(date_time, '%Y-%m-%d')
