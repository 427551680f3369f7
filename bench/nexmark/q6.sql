-- Nexmark q6, average selling price by seller: for each auction's winning
-- bid, the average of the winning prices of the seller's auctions up to it
-- (the ten before it and itself, in the order of the winning bids' times).
-- Published (Flink, marked there as not supported: its OVER aggregation
-- cannot read the top-N's updates):
--   SELECT Q.seller, AVG(Q.price) OVER
--       (PARTITION BY Q.seller ORDER BY Q.dateTime ROWS BETWEEN 10 PRECEDING AND CURRENT ROW)
--   FROM (SELECT *, ROW_NUMBER() OVER (PARTITION BY A.id, A.seller ORDER BY B.price DESC) AS rownum
--         FROM (SELECT A.id, A.seller, B.price, B.dateTime
--               FROM auction AS A, bid AS B
--               WHERE A.id = B.auction and B.dateTime between A.dateTime and A.expires)
--         WHERE rownum <= 1) AS Q
-- ubik: the published text filters on rownum in the SELECT that names it
-- and reads A and B outside their subquery, which SQL does not allow: the
-- ranking and its bound are written as two levels, and the comma join as
-- JOIN ... ON (as in q3). The result selects Q.id: one row per auction,
-- keyed by the top-N's key (id, seller), upserted whenever the auction's
-- winning bid, or one of the ten before it, changes; its latest value per
-- key is the published query's result. Bids equal in price are told apart
-- by the columns the ranking's result holds (id, seller, price, date_time:
-- the earlier bid wins), and auctions whose winning bids have the same
-- time by their other columns (ascending). The average is a DOUBLE
-- (Flink's AVG of a BIGINT is a BIGINT, truncated).
-- oracle: SELECT Q.id, Q.seller, AVG(Q.price) OVER (PARTITION BY Q.seller
-- oracle:   ORDER BY Q.date_time, Q.id, Q.seller, Q.price, Q.date_time, Q.rownum
-- oracle:   ROWS BETWEEN 10 PRECEDING AND CURRENT ROW) AS avg_price
-- oracle: FROM (SELECT * FROM (SELECT A.id, A.seller, B.price, B.date_time,
-- oracle:         ROW_NUMBER() OVER (PARTITION BY A.id, A.seller ORDER BY B.price DESC,
-- oracle:           A.id, A.seller, B.price, B.date_time) AS rownum
-- oracle:       FROM auction A JOIN bid B ON A.id = B.auction AND B.date_time BETWEEN A.date_time AND A.expires)
-- oracle:       WHERE rownum <= 1) Q
SELECT Q.id, Q.seller,
       AVG(Q.price) OVER (PARTITION BY Q.seller ORDER BY Q.date_time
                          ROWS BETWEEN 10 PRECEDING AND CURRENT ROW) AS avg_price
FROM (SELECT *
      FROM (SELECT A.id, A.seller, B.price, B.date_time,
                   ROW_NUMBER() OVER (PARTITION BY A.id, A.seller ORDER BY B.price DESC) AS rownum
            FROM auction A JOIN bid B ON A.id = B.auction AND B.date_time BETWEEN A.date_time AND A.expires)
      WHERE rownum <= 1) Q
