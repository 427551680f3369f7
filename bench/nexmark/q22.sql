-- Nexmark q22, get URL directories: each bid with the first three
-- directories of its URL.
-- Published (Flink):
--   SELECT auction, bidder, price, channel,
--          SPLIT_INDEX(url, '/', 3) as dir1,
--          SPLIT_INDEX(url, '/', 4) as dir2,
--          SPLIT_INDEX(url, '/', 5) as dir3 FROM bid
-- ubik: SPLIT_INDEX counts from 0, split_part from 1, so the indices are
-- one higher; where the URL has fewer parts, SPLIT_INDEX gives null and
-- split_part an empty string (the generator's URLs always have them).
-- oracle: the query, in one shot
SELECT
    auction, bidder, price, channel,
    split_part(url, '/', 4) AS dir1,
    split_part(url, '/', 5) AS dir2,
    split_part(url, '/', 6) AS dir3
FROM bid
