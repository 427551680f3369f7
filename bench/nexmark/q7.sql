-- Nexmark q7, highest bid: the bids with the highest price of each
-- 10-second window (a windowed max joined back to the bids).
-- Published (Flink):
--   SELECT B.auction, B.price, B.bidder, B.dateTime, B.extra FROM bid B
--   JOIN (SELECT MAX(B1.price) AS maxprice, TUMBLE_ROWTIME(B1.dateTime, INTERVAL '10' SECOND) AS dateTime
--         FROM bid B1 GROUP BY TUMBLE(B1.dateTime, INTERVAL '10' SECOND)) B1
--   ON B.price = B1.maxprice
--   WHERE B.dateTime BETWEEN B1.dateTime - INTERVAL '10' SECOND AND B1.dateTime
-- ubik: TUMBLE(...) names the window by its start (ubik has no TUMBLE_ROWTIME),
-- so the bid must lie in [start, start + 10 s): the window the max was taken
-- over. Flink's BETWEEN rowtime - 10 s AND rowtime (rowtime = end - 1 ms) also
-- admits a bid in the last millisecond of the previous window.
-- oracle: SELECT b.auction, b.price, b.bidder, b.date_time, b.extra FROM bid b
-- oracle: JOIN (SELECT max(price) AS maxprice, date_bin(INTERVAL '10 seconds', date_time, TIMESTAMP '1970-01-01T00:00:00Z') AS w
-- oracle:       FROM bid GROUP BY 2) m
-- oracle: ON b.price = m.maxprice AND b.date_time >= m.w AND b.date_time < m.w + INTERVAL '10 seconds'
SELECT B.auction, B.price, B.bidder, B.date_time, B.extra
FROM bid B
JOIN (SELECT max(price) AS maxprice, TUMBLE(date_time, INTERVAL '10' SECOND) AS w
      FROM bid GROUP BY TUMBLE(date_time, INTERVAL '10' SECOND)) B1
ON B.price = B1.maxprice
   AND B.date_time >= B1.w AND B.date_time < B1.w + INTERVAL '10' SECOND
