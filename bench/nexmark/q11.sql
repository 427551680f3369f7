-- Nexmark q11, user sessions: how many bids each bidder makes in a session
-- (a run of bids no more than 10 s apart).
-- Published (Flink):
--   SELECT B.bidder, count(*) as bid_count,
--          SESSION_START(B.dateTime, INTERVAL '10' SECOND) as starttime,
--          SESSION_END(B.dateTime, INTERVAL '10' SECOND) as endtime
--   FROM bid B GROUP BY B.bidder, SESSION(B.dateTime, INTERVAL '10' SECOND)
-- ubik: SESSION(...) names the session by its start (no SESSION_START or
-- SESSION_END; the end is the last bid plus the gap, so it is left out).
-- oracle: WITH g AS (SELECT bidder, date_time,
-- oracle:   CASE WHEN date_time - lag(date_time) OVER (PARTITION BY bidder ORDER BY date_time) < INTERVAL '10 seconds'
-- oracle:   THEN 0 ELSE 1 END AS new_session FROM bid),
-- oracle: s AS (SELECT bidder, date_time, sum(new_session) OVER (PARTITION BY bidder ORDER BY date_time
-- oracle:   ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS session FROM g)
-- oracle: SELECT bidder, count(*) AS bid_count, min(date_time) AS starttime FROM s GROUP BY bidder, session
SELECT B.bidder, count(*) AS bid_count, SESSION(B.date_time, INTERVAL '10' SECOND) AS starttime
FROM bid B
GROUP BY B.bidder, SESSION(B.date_time, INTERVAL '10' SECOND)
