-- Nexmark q4, average price for a category: the average winning price of
-- the auctions of each category, a winning price being the highest bid
-- made while the auction was open.
-- Published (Flink):
--   SELECT Q.category, AVG(Q.final)
--   FROM (SELECT MAX(B.price) AS final, A.category
--         FROM auction A, bid B
--         WHERE A.id = B.auction AND B.dateTime BETWEEN A.dateTime AND A.expires
--         GROUP BY A.id, A.category) Q
--   GROUP BY Q.category
-- ubik: the comma join's conditions are written as JOIN ... ON (as in q3),
-- and the average is named. The inner aggregation is continuous: when an
-- auction's highest bid rises, its old value is taken back out of its
-- category's average before the new one goes in. The average is a DOUBLE
-- (Flink's AVG of a BIGINT is a BIGINT, truncated).
-- oracle: the query, in one shot
SELECT Q.category, AVG(Q.final) AS avg_final
FROM (SELECT MAX(B.price) AS final, A.category
      FROM auction A JOIN bid B ON A.id = B.auction AND B.date_time BETWEEN A.date_time AND A.expires
      GROUP BY A.id, A.category) Q
GROUP BY Q.category
