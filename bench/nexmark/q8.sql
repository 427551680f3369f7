-- Nexmark q8, monitor new users: people who opened an auction in the
-- 10-second window they registered in.
-- Published (Flink):
--   SELECT P.id, P.name, P.starttime FROM (
--     SELECT P.id, P.name, TUMBLE_START(P.dateTime, INTERVAL '10' SECOND) AS starttime,
--            TUMBLE_END(P.dateTime, INTERVAL '10' SECOND) AS endtime
--     FROM person P GROUP BY P.id, P.name, TUMBLE(P.dateTime, INTERVAL '10' SECOND)) P
--   JOIN (
--     SELECT A.seller, TUMBLE_START(A.dateTime, INTERVAL '10' SECOND) AS starttime,
--            TUMBLE_END(A.dateTime, INTERVAL '10' SECOND) AS endtime
--     FROM auction A GROUP BY A.seller, TUMBLE(A.dateTime, INTERVAL '10' SECOND)) A
--   ON P.id = A.seller AND P.starttime = A.starttime AND P.endtime = A.endtime
-- ubik: TUMBLE(...) is the window start; equal starts of equal-size windows
-- are equal windows, so the endtime columns are left out.
-- oracle: SELECT p.id, p.name, p.starttime FROM
-- oracle: (SELECT id, name, date_bin(INTERVAL '10 seconds', date_time, TIMESTAMP '1970-01-01T00:00:00Z') AS starttime FROM person GROUP BY 1, 2, 3) p
-- oracle: JOIN (SELECT seller, date_bin(INTERVAL '10 seconds', date_time, TIMESTAMP '1970-01-01T00:00:00Z') AS starttime FROM auction GROUP BY 1, 2) a
-- oracle: ON p.id = a.seller AND p.starttime = a.starttime
SELECT P.id, P.name, P.starttime
FROM (SELECT id, name, TUMBLE(date_time, INTERVAL '10' SECOND) AS starttime
      FROM person GROUP BY id, name, TUMBLE(date_time, INTERVAL '10' SECOND)) P
JOIN (SELECT seller, TUMBLE(date_time, INTERVAL '10' SECOND) AS starttime
      FROM auction GROUP BY seller, TUMBLE(date_time, INTERVAL '10' SECOND)) A
ON P.id = A.seller AND P.starttime = A.starttime
