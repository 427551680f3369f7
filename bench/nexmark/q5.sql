-- Nexmark q5, hot items: the auctions with the most bids in each sliding
-- window (10 s windows every 2 s).
-- Published (Flink):
--   SELECT AuctionBids.auction, AuctionBids.num
--   FROM (SELECT B1.auction, count(*) AS num,
--                HOP_START(B1.dateTime, INTERVAL '2' SECOND, INTERVAL '10' SECOND) AS starttime,
--                HOP_END(B1.dateTime, INTERVAL '2' SECOND, INTERVAL '10' SECOND) AS endtime
--         FROM bid B1 GROUP BY B1.auction, HOP(B1.dateTime, INTERVAL '2' SECOND, INTERVAL '10' SECOND)) AS AuctionBids
--   JOIN (SELECT max(CountBids.num) AS maxn, CountBids.starttime, CountBids.endtime
--         FROM (SELECT count(*) AS num,
--                      HOP_START(B2.dateTime, INTERVAL '2' SECOND, INTERVAL '10' SECOND) AS starttime,
--                      HOP_END(B2.dateTime, INTERVAL '2' SECOND, INTERVAL '10' SECOND) AS endtime
--               FROM bid B2 GROUP BY B2.auction, HOP(B2.dateTime, INTERVAL '2' SECOND, INTERVAL '10' SECOND)) AS CountBids
--         GROUP BY CountBids.starttime, CountBids.endtime) AS MaxBids
--   ON AuctionBids.starttime = MaxBids.starttime AND AuctionBids.endtime = MaxBids.endtime
--      AND AuctionBids.num >= MaxBids.maxn
-- ubik: HOP(...) names the window by its start (no HOP_START/HOP_END; equal
-- starts of equal-size windows are equal windows, so endtime is left out);
-- the inner CountBids selects its GROUP BY column auction (ubik keys every
-- aggregation by its GROUP BY columns); the window start is in the result,
-- since several windows hold the same auction.
-- oracle: WITH h AS (SELECT auction, date_bin(INTERVAL '2 seconds', date_time, TIMESTAMP '1970-01-01T00:00:00Z') AS s FROM bid),
-- oracle: c AS (SELECT auction, starttime, count(*) AS num FROM (
-- oracle:   SELECT auction, s AS starttime FROM h UNION ALL SELECT auction, s - INTERVAL '2 seconds' FROM h
-- oracle:   UNION ALL SELECT auction, s - INTERVAL '4 seconds' FROM h UNION ALL SELECT auction, s - INTERVAL '6 seconds' FROM h
-- oracle:   UNION ALL SELECT auction, s - INTERVAL '8 seconds' FROM h) w GROUP BY auction, starttime),
-- oracle: m AS (SELECT starttime, max(num) AS maxn FROM c GROUP BY starttime)
-- oracle: SELECT c.auction, c.num, c.starttime FROM c JOIN m ON c.starttime = m.starttime AND c.num >= m.maxn
SELECT AuctionBids.auction, AuctionBids.num, AuctionBids.starttime
FROM (SELECT B1.auction, count(*) AS num,
             HOP(B1.date_time, INTERVAL '2' SECOND, INTERVAL '10' SECOND) AS starttime
      FROM bid B1
      GROUP BY B1.auction, HOP(B1.date_time, INTERVAL '2' SECOND, INTERVAL '10' SECOND)) AuctionBids
JOIN (SELECT max(CountBids.num) AS maxn, CountBids.starttime
      FROM (SELECT B2.auction, count(*) AS num,
                   HOP(B2.date_time, INTERVAL '2' SECOND, INTERVAL '10' SECOND) AS starttime
            FROM bid B2
            GROUP BY B2.auction, HOP(B2.date_time, INTERVAL '2' SECOND, INTERVAL '10' SECOND)) CountBids
      GROUP BY CountBids.starttime) MaxBids
ON AuctionBids.starttime = MaxBids.starttime AND AuctionBids.num >= MaxBids.maxn
