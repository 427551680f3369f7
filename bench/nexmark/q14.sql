-- Nexmark q14, calculation: bids in a price band, converted, with the part
-- of the day they came in and a character count of their extra field.
-- Published (Flink, with a Java UDF count_char):
--   SELECT auction, bidder, 0.908 * price as price,
--          CASE WHEN HOUR(dateTime) >= 8 AND HOUR(dateTime) <= 18 THEN 'dayTime'
--               WHEN HOUR(dateTime) <= 6 OR HOUR(dateTime) >= 20 THEN 'nightTime'
--               ELSE 'otherTime' END AS bidTimeType,
--          dateTime, extra, count_char(extra, 'c') AS c_counts
--   FROM bid WHERE 0.908 * price > 1000000 AND 0.908 * price < 50000000
-- ubik: HOUR(t) is extract(hour FROM t); count_char(s, 'c') is written with
-- built-ins as length(s) - length(replace(s, 'c', '')) (ubik has no UDFs).
-- oracle: SELECT auction, bidder, 0.908 * price AS price,
-- oracle:   CASE WHEN extract(hour FROM date_time) >= 8 AND extract(hour FROM date_time) <= 18 THEN 'dayTime'
-- oracle:        WHEN extract(hour FROM date_time) <= 6 OR extract(hour FROM date_time) >= 20 THEN 'nightTime'
-- oracle:        ELSE 'otherTime' END AS bid_time_type,
-- oracle:   date_time, extra, length(extra) - length(replace(extra, 'c', '')) AS c_counts
-- oracle: FROM bid WHERE 0.908 * price > 1000000 AND 0.908 * price < 50000000
SELECT
    auction, bidder, 0.908 * price AS price,
    CASE
        WHEN extract(hour FROM date_time) >= 8 AND extract(hour FROM date_time) <= 18 THEN 'dayTime'
        WHEN extract(hour FROM date_time) <= 6 OR extract(hour FROM date_time) >= 20 THEN 'nightTime'
        ELSE 'otherTime'
    END AS bid_time_type,
    date_time, extra,
    length(extra) - length(replace(extra, 'c', '')) AS c_counts
FROM bid
WHERE 0.908 * price > 1000000 AND 0.908 * price < 50000000
