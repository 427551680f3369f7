/*
 * Flink SQL peer of ubik's Kafka benchmarks: queries run by Flink SQL in a local mini-cluster
 * (embedded in this JVM), Kafka to Kafka.
 *
 *   FlinkPeer BROKER IN_TOPIC OUT_TOPIC
 *       bench/kafka.sh: the per-merchant per-minute tumbling-window query. Reads IN_TOPIC (JSON
 *       {"merchant","ts","amount"}), event time ts with zero lateness, and writes an upsert
 *       changelog keyed by (merchant, window_start) to OUT_TOPIC (JSON key and value).
 *   FlinkPeer nexmark QUERY BROKER OUT_TOPIC TABLE=TOPIC... [lateness_ms=5000] [out_partitions=N] [registry=URL]
 *       bench/nexmark-kafka.sh: Nexmark QUERY (q0, q1, q2, q3, q4, q5, q7, q8, q9, q11, q14, q15, q16, q17, q18, q19, q20, q21 or q22), the published Flink SQL
 *       (nexmark/nexmark, queries/qN.sql) with ubik's snake_case column names, over the tables
 *       bid, person and auction (TABLE=TOPIC for each table the query reads) as ubik writes them
 *       (JSON, RFC 3339 timestamps): event time date_time with the watermark lateness_ms behind
 *       it (ubik's default lateness, 5 s). Every result is insert-only, written as JSON values
 *       without a key (the 'kafka' connector) to OUT_TOPIC, created with N partitions if it does
 *       not exist and out_partitions is given (else the broker's default applies). With
 *       registry=URL the tables are Confluent-framed Avro as ubik's format=avro writes them, read
 *       by Flink's 'avro-confluent' format against that schema registry.
 *   FlinkPeer count BROKER TOPIC...
 *       Counts the committed records of each TOPIC (read_committed: transaction markers and
 *       aborted records left out) and prints one line {"topic":TOPIC,"records":N} for each.
 *   FlinkPeer delete BROKER TOPIC...
 *       Deletes the topics (those that exist).
 *
 * A query reads its topics from the earliest offsets up to the latest offsets at start (a bounded
 * job) and prints one JSON line to stdout:
 *   {"bench":"flink","seconds":S,"job_runtime_seconds":R,"output_records":N|null,"cpu_seconds":C}
 * S: from submitting the INSERT (planning, mini-cluster start, run) until the job finished,
 * with all output flushed; R: Flink's own net runtime of the job; N: records appended to
 * OUT_TOPIC during the run (its end offsets after minus before); C: CPU time of this JVM (all
 * threads) from its start until the job finished. Logs go to stderr.
 * System properties: parallelism (default 2).
 */
package dev.ubik.bench;

import java.io.PrintStream;
import java.lang.management.ManagementFactory;
import java.time.Duration;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import java.util.Properties;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.TimeUnit;
import java.util.stream.Collectors;
import java.util.stream.Stream;
import org.apache.flink.api.common.JobExecutionResult;
import org.apache.flink.configuration.Configuration;
import org.apache.flink.configuration.CoreOptions;
import org.apache.flink.configuration.PipelineOptions;
import org.apache.flink.table.api.EnvironmentSettings;
import org.apache.flink.table.api.TableEnvironment;
import org.apache.flink.table.api.TableResult;
import org.apache.flink.table.api.config.TableConfigOptions;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AdminClientConfig;
import org.apache.kafka.clients.admin.NewTopic;
import org.apache.kafka.clients.admin.OffsetSpec;
import org.apache.kafka.clients.admin.TopicDescription;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRecords;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.common.PartitionInfo;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.errors.UnknownTopicOrPartitionException;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;

public final class FlinkPeer {
  private static final String USAGE = "usage: FlinkPeer BROKER IN_TOPIC OUT_TOPIC\n"
      + "       FlinkPeer nexmark QUERY BROKER OUT_TOPIC TABLE=TOPIC... [lateness_ms=N] [out_partitions=N] [registry=URL]\n"
      + "       FlinkPeer count|delete BROKER TOPIC...";

  public static void main(String[] args) {
    try {
      if (args.length >= 1 && args[0].equals("nexmark")) {
        if (args.length < 5) usage();
        Map<String, String> opts = new LinkedHashMap<>();
        for (int i = 4; i < args.length; i++) {
          int eq = args[i].indexOf('=');
          if (eq <= 0) usage();
          opts.put(args[i].substring(0, eq), args[i].substring(eq + 1));
        }
        nexmark(args[1], args[2], args[3], opts);
      } else if (args.length >= 3 && args[0].equals("count")) {
        PrintStream result = System.out;
        System.setOut(System.err);
        for (int i = 2; i < args.length; i++) {
          result.printf(Locale.ROOT, "{\"topic\":\"%s\",\"records\":%d}%n", args[i],
              count(args[1], args[i]));
        }
        result.flush();
      } else if (args.length >= 3 && args[0].equals("delete")) {
        delete(args[1], List.of(args).subList(2, args.length));
      } else if (args.length == 3) {
        tumble(args[0], args[1], args[2]);
      } else {
        usage();
      }
    } catch (Throwable e) {
      e.printStackTrace();
      System.exit(1); // the mini-cluster's threads would keep the JVM alive
    }
    System.exit(0); // likewise after success
  }

  private static void usage() {
    System.err.println(USAGE);
    System.exit(2);
  }

  /** A streaming table environment on a local mini-cluster; stdout is sent to stderr. */
  private static TableEnvironment env(String name) {
    Configuration conf = new Configuration();
    conf.set(CoreOptions.DEFAULT_PARALLELISM, Integer.getInteger("parallelism", 2));
    conf.set(PipelineOptions.NAME, name);
    conf.set(PipelineOptions.OBJECT_REUSE, true); // no defensive copies between chained operators
    // Windows and TIMESTAMP_LTZ rendering in UTC, whatever the machine's zone.
    conf.set(TableConfigOptions.LOCAL_TIME_ZONE, "UTC");
    return TableEnvironment.create(
        EnvironmentSettings.newInstance().inStreamingMode().withConfiguration(conf).build());
  }

  private static void tumble(String broker, String in, String out) throws Exception {
    // stdout carries only the result line: anything else printed goes to stderr.
    PrintStream result = System.out;
    System.setOut(System.err);
    TableEnvironment t = env("ubik-bench-flink");

    // 'Z'-suffixed ISO-8601 timestamps parse as TIMESTAMP_LTZ with the ISO-8601 JSON standard.
    t.executeSql("CREATE TABLE src (\n"
        + "  merchant STRING,\n"
        + "  ts TIMESTAMP_LTZ(3),\n"
        + "  amount DOUBLE,\n"
        + "  WATERMARK FOR ts AS ts\n"
        + ") WITH (\n"
        + source(broker, in)
        + ")");
    t.executeSql("CREATE TABLE sink (\n"
        + "  merchant STRING,\n"
        + "  window_start TIMESTAMP(3),\n"
        + "  n BIGINT,\n"
        + "  total DOUBLE,\n"
        + "  mean DOUBLE,\n"
        + "  PRIMARY KEY (merchant, window_start) NOT ENFORCED\n"
        + ") WITH (\n"
        + upsertSink(broker, out)
        + ")");
    String query = "INSERT INTO sink\n"
        + "SELECT merchant, window_start, COUNT(*) AS n, SUM(amount) AS total, AVG(amount) AS mean\n"
        + "FROM TABLE(TUMBLE(TABLE src, DESCRIPTOR(ts), INTERVAL '1' MINUTE))\n"
        + "GROUP BY merchant, window_start, window_end";
    execute(t, query, broker, out, result);
  }

  /**
   * The sinks compress as ubik's Kafka sink does by default (lz4), so both engines write the same
   * bytes to the broker and pay for the same work (the Kafka producer's default is none).
   */
  private static final String COMPRESSION = "  'properties.compression.type' = 'lz4',\n";

  /** The WITH options of an upsert-kafka sink: JSON key and value, ISO-8601 timestamps. */
  private static String upsertSink(String broker, String topic) {
    return "  'connector' = 'upsert-kafka',\n"
        + "  'topic' = " + lit(topic) + ",\n"
        + "  'properties.bootstrap.servers' = " + lit(broker) + ",\n"
        + COMPRESSION
        + "  'key.format' = 'json',\n"
        + "  'key.json.timestamp-format.standard' = 'ISO-8601',\n"
        + "  'value.format' = 'json',\n"
        + "  'value.json.timestamp-format.standard' = 'ISO-8601'\n";
  }

  private static String source(String broker, String topic) {
    return source(broker, topic, "  'format' = 'json',\n"
        + "  'json.timestamp-format.standard' = 'ISO-8601'\n");
  }

  private static String source(String broker, String topic, String format) {
    return "  'connector' = 'kafka',\n"
        + "  'topic' = " + lit(topic) + ",\n"
        + "  'properties.bootstrap.servers' = " + lit(broker) + ",\n"
        + "  'scan.startup.mode' = 'earliest-offset',\n"
        + "  'scan.bounded.mode' = 'latest-offset',\n"
        + format;
  }

  // The Nexmark tables as ubik's nexmark:// source names them and ubik's Kafka sink writes them
  // (JSON objects, timestamps RFC 3339 UTC: TIMESTAMP_LTZ with the ISO-8601 standard). Event time:
  // date_time (the published DDL's dateTime).
  private static final Map<String, String> TABLES = Map.of(
      "person", "  id BIGINT,\n  name STRING,\n  email_address STRING,\n  credit_card STRING,\n"
          + "  city STRING,\n  state STRING,\n  date_time TIMESTAMP_LTZ(3),\n  extra STRING,\n",
      "auction", "  id BIGINT,\n  item_name STRING,\n  description STRING,\n  initial_bid BIGINT,\n"
          + "  reserve BIGINT,\n  date_time TIMESTAMP_LTZ(3),\n  expires TIMESTAMP_LTZ(3),\n"
          + "  seller BIGINT,\n  category BIGINT,\n  extra STRING,\n",
      "bid", "  auction BIGINT,\n  bidder BIGINT,\n  price BIGINT,\n  channel STRING,\n"
          + "  url STRING,\n  date_time TIMESTAMP_LTZ(3),\n  extra STRING,\n");

  /** A Nexmark query: the tables it reads, its sink's columns, and its INSERT. */
  /** A query's tables, sink columns and SELECT; `upsertKey`: its result is an update stream,
   * written with upsert-kafka keyed by these columns (null: append-only, plain kafka). */
  private record Nexmark(List<String> tables, String sinkColumns, String select, String upsertKey) {
    Nexmark(List<String> tables, String sinkColumns, String select) {
      this(tables, sinkColumns, select, null);
    }
  }

  // The price-rank counts q15, q16 and q17 share, and the distinct counts of q15 and q16 (the
  // SELECT list's lines, then the sink's columns).
  private static final String RANK_COUNTS = "  count(*) AS total_bids,\n"
      + "  count(*) filter (where price < 10000) AS rank1_bids,\n"
      + "  count(*) filter (where price >= 10000 and price < 1000000) AS rank2_bids,\n"
      + "  count(*) filter (where price >= 1000000) AS rank3_bids,\n";
  private static final String DISTINCT_COUNTS = Stream.of("bidder", "auction")
      .map(c -> "  count(distinct " + c + ") AS total_" + c + "s,\n"
          + "  count(distinct " + c + ") filter (where price < 10000) AS rank1_" + c + "s,\n"
          + "  count(distinct " + c + ") filter (where price >= 10000 and price < 1000000) AS rank2_"
          + c + "s,\n"
          + "  count(distinct " + c + ") filter (where price >= 1000000) AS rank3_" + c + "s")
      .collect(Collectors.joining(",\n", "", "\n"));
  private static final String RANK_COLUMNS = "total_bids BIGINT, rank1_bids BIGINT, rank2_bids BIGINT, rank3_bids BIGINT";
  private static final String DISTINCT_COLUMNS = Stream.of("bidder", "auction")
      .map(c -> Stream.of("total", "rank1", "rank2", "rank3")
          .map(r -> r + "_" + c + "s BIGINT").collect(Collectors.joining(", ")))
      .collect(Collectors.joining(", "));

  // The published Flink SQL (github.com/nexmark/nexmark, nexmark-flink/src/main/resources/queries),
  // dateTime renamed date_time; sink columns in the SELECT's order.
  private static final Map<String, Nexmark> QUERIES = Map.ofEntries(
      Map.entry("q0", new Nexmark(List.of("bid"),
          "auction BIGINT, bidder BIGINT, price BIGINT, date_time TIMESTAMP_LTZ(3), extra STRING",
          "SELECT auction, bidder, price, date_time, extra FROM bid")),
      Map.entry("q1", new Nexmark(List.of("bid"),
          "auction BIGINT, bidder BIGINT, price DECIMAL(23, 3), date_time TIMESTAMP_LTZ(3), extra STRING",
          "SELECT auction, bidder, 0.908 * price as price, date_time, extra FROM bid")),
      Map.entry("q2", new Nexmark(List.of("bid"),
          "auction BIGINT, price BIGINT",
          "SELECT auction, price FROM bid WHERE MOD(auction, 123) = 0")),
      Map.entry("q3", new Nexmark(List.of("person", "auction"),
          "name STRING, city STRING, state STRING, id BIGINT",
          // The generator (the `nexmark` crate) writes states in lower case.
          "SELECT P.name, P.city, P.state, A.id\n"
              + "FROM auction AS A INNER JOIN person AS P on A.seller = P.id\n"
              + "WHERE A.category = 10 and (P.state = 'or' OR P.state = 'id' OR P.state = 'ca')")),
      // The published q5 with starttime in the result, as ubik's (several windows hold one
      // auction). MaxBids is a regular GROUP BY: its maximum is revised as windows fill, so the
      // join's result is an update stream (written as upserts, folded to compare).
      Map.entry("q5", new Nexmark(List.of("bid"),
          "auction BIGINT, num BIGINT, starttime TIMESTAMP_LTZ(3)",
          "SELECT AuctionBids.auction, AuctionBids.num, AuctionBids.starttime\n"
              + "FROM (\n"
              + "  SELECT B1.auction, count(*) AS num,\n"
              + "    HOP_START(B1.date_time, INTERVAL '2' SECOND, INTERVAL '10' SECOND) AS starttime,\n"
              + "    HOP_END(B1.date_time, INTERVAL '2' SECOND, INTERVAL '10' SECOND) AS endtime\n"
              + "  FROM bid B1\n"
              + "  GROUP BY B1.auction, HOP(B1.date_time, INTERVAL '2' SECOND, INTERVAL '10' SECOND)\n"
              + ") AS AuctionBids\n"
              + "JOIN (\n"
              + "  SELECT max(CountBids.num) AS maxn, CountBids.starttime, CountBids.endtime\n"
              + "  FROM (\n"
              + "    SELECT count(*) AS num,\n"
              + "      HOP_START(B2.date_time, INTERVAL '2' SECOND, INTERVAL '10' SECOND) AS starttime,\n"
              + "      HOP_END(B2.date_time, INTERVAL '2' SECOND, INTERVAL '10' SECOND) AS endtime\n"
              + "    FROM bid B2\n"
              + "    GROUP BY B2.auction, HOP(B2.date_time, INTERVAL '2' SECOND, INTERVAL '10' SECOND)\n"
              + "  ) AS CountBids\n"
              + "  GROUP BY CountBids.starttime, CountBids.endtime\n"
              + ") AS MaxBids\n"
              + "ON AuctionBids.starttime = MaxBids.starttime AND\n"
              + "   AuctionBids.endtime = MaxBids.endtime AND\n"
              + "   AuctionBids.num >= MaxBids.maxn",
          "auction, starttime")),
      Map.entry("q7", new Nexmark(List.of("bid"),
          "auction BIGINT, price BIGINT, bidder BIGINT, date_time TIMESTAMP_LTZ(3), extra STRING",
          "SELECT B.auction, B.price, B.bidder, B.date_time, B.extra\n"
              + "from bid B\n"
              + "JOIN (\n"
              + "  SELECT MAX(B1.price) AS maxprice, TUMBLE_ROWTIME(B1.date_time, INTERVAL '10' SECOND) as date_time\n"
              + "  FROM bid B1\n"
              + "  GROUP BY TUMBLE(B1.date_time, INTERVAL '10' SECOND)\n"
              + ") B1\n"
              + "ON B.price = B1.maxprice\n"
              + "WHERE B.date_time BETWEEN B1.date_time  - INTERVAL '10' SECOND AND B1.date_time")),
      Map.entry("q8", new Nexmark(List.of("person", "auction"),
          "id BIGINT, name STRING, stime TIMESTAMP_LTZ(3)",
          "SELECT P.id, P.name, P.starttime\n"
              + "FROM (\n"
              + "  SELECT P.id, P.name,\n"
              + "         TUMBLE_START(P.date_time, INTERVAL '10' SECOND) AS starttime,\n"
              + "         TUMBLE_END(P.date_time, INTERVAL '10' SECOND) AS endtime\n"
              + "  FROM person P\n"
              + "  GROUP BY P.id, P.name, TUMBLE(P.date_time, INTERVAL '10' SECOND)\n"
              + ") P\n"
              + "JOIN (\n"
              + "  SELECT A.seller,\n"
              + "         TUMBLE_START(A.date_time, INTERVAL '10' SECOND) AS starttime,\n"
              + "         TUMBLE_END(A.date_time, INTERVAL '10' SECOND) AS endtime\n"
              + "  FROM auction A\n"
              + "  GROUP BY A.seller, TUMBLE(A.date_time, INTERVAL '10' SECOND)\n"
              + ") A\n"
              + "ON P.id = A.seller AND P.starttime = A.starttime AND P.endtime = A.endtime")),
      // A regular join in Flink (expires is not a time attribute), whose inputs must not carry
      // rowtime attributes: the published query reads views of the tables without them, here
      // subqueries that compute their times. The ranking is an update stream.
      // As q9, a regular join in Flink over the tables without rowtime attributes; an update
      // stream (each auction's maximum is revised as bids come in).
      Map.entry("q4", new Nexmark(List.of("auction", "bid"),
          "category BIGINT, avg_final BIGINT",
          "SELECT Q.category, AVG(Q.final) AS avg_final\n"
              + "FROM (\n"
              + "  SELECT MAX(B.price) AS final, A.category\n"
              + "  FROM (SELECT id, category, CAST(date_time AS TIMESTAMP_LTZ(3)) AS date_time, expires\n"
              + "        FROM auction) A,\n"
              + "       (SELECT auction, price, CAST(date_time AS TIMESTAMP_LTZ(3)) AS date_time FROM bid) B\n"
              + "  WHERE A.id = B.auction AND B.date_time BETWEEN A.date_time AND A.expires\n"
              + "  GROUP BY A.id, A.category\n"
              + ") Q\n"
              + "GROUP BY Q.category",
          "category")),
      Map.entry("q9", new Nexmark(List.of("auction", "bid"),
          "id BIGINT, item_name STRING, description STRING, initial_bid BIGINT, reserve BIGINT, "
              + "date_time TIMESTAMP_LTZ(3), expires TIMESTAMP_LTZ(3), seller BIGINT, category BIGINT, "
              + "extra STRING, auction BIGINT, bidder BIGINT, price BIGINT, "
              + "bid_date_time TIMESTAMP_LTZ(3), bid_extra STRING",
          "SELECT id, item_name, description, initial_bid, reserve, date_time, expires, seller, category, extra,\n"
              + "  auction, bidder, price, bid_date_time, bid_extra\n"
              + "FROM (\n"
              + "  SELECT A.*, B.auction, B.bidder, B.price, B.date_time AS bid_date_time, B.extra AS bid_extra,\n"
              + "    ROW_NUMBER() OVER (PARTITION BY A.id ORDER BY B.price DESC, B.date_time ASC) AS rownum\n"
              + "  FROM (SELECT id, item_name, description, initial_bid, reserve,\n"
              + "          CAST(date_time AS TIMESTAMP_LTZ(3)) AS date_time, expires,\n"
              + "          seller, category, extra FROM auction) A,\n"
              + "       (SELECT auction, bidder, price, channel, url,\n"
              + "          CAST(date_time AS TIMESTAMP_LTZ(3)) AS date_time, extra FROM bid) B\n"
              + "  WHERE A.id = B.auction AND B.date_time BETWEEN A.date_time AND A.expires\n"
              + ")\n"
              + "WHERE rownum <= 1",
          "id")),
      // SESSION_END is left out, as in ubik's (the last bid plus the gap).
      Map.entry("q11", new Nexmark(List.of("bid"),
          "bidder BIGINT, bid_count BIGINT, starttime TIMESTAMP_LTZ(3)",
          "SELECT B.bidder, count(*) as bid_count,\n"
              + "  SESSION_START(B.date_time, INTERVAL '10' SECOND) as starttime\n"
              + "FROM bid B\n"
              + "GROUP BY B.bidder, SESSION(B.date_time, INTERVAL '10' SECOND)")),
      // count_char(extra, 'c') is the published query's Java UDF, written with built-ins as in
      // ubik's; HOUR(date_time) as EXTRACT (the column is a TIMESTAMP_LTZ).
      Map.entry("q14", new Nexmark(List.of("bid"),
          "auction BIGINT, bidder BIGINT, price DECIMAL(23, 3), bid_time_type STRING, "
              + "date_time TIMESTAMP_LTZ(3), extra STRING, c_counts INT",
          "SELECT auction, bidder, 0.908 * price as price,\n"
              + "  CASE\n"
              + "    WHEN EXTRACT(HOUR FROM date_time) >= 8 AND EXTRACT(HOUR FROM date_time) <= 18 THEN 'dayTime'\n"
              + "    WHEN EXTRACT(HOUR FROM date_time) <= 6 OR EXTRACT(HOUR FROM date_time) >= 20 THEN 'nightTime'\n"
              + "    ELSE 'otherTime'\n"
              + "  END AS bid_time_type,\n"
              + "  date_time, extra,\n"
              + "  CHAR_LENGTH(extra) - CHAR_LENGTH(REPLACE(extra, 'c', '')) AS c_counts\n"
              + "FROM bid\n"
              + "WHERE 0.908 * price > 1000000 AND 0.908 * price < 50000000")),
      Map.entry("q15", new Nexmark(List.of("bid"),
          "`day` STRING, " + RANK_COLUMNS + ", " + DISTINCT_COLUMNS,
          "SELECT DATE_FORMAT(date_time, 'yyyy-MM-dd') as `day`,\n"
          + RANK_COUNTS
          + DISTINCT_COUNTS
              + "FROM bid\n"
              + "GROUP BY DATE_FORMAT(date_time, 'yyyy-MM-dd')",
          "`day`")),
      Map.entry("q16", new Nexmark(List.of("bid"),
          "channel STRING, `day` STRING, `minute` STRING, " + RANK_COLUMNS + ", "
              + DISTINCT_COLUMNS,
          "SELECT channel, DATE_FORMAT(date_time, 'yyyy-MM-dd') as `day`,\n"
              + "  max(DATE_FORMAT(date_time, 'HH:mm')) as `minute`,\n"
          + RANK_COUNTS
          + DISTINCT_COUNTS
              + "FROM bid\n"
              + "GROUP BY channel, DATE_FORMAT(date_time, 'yyyy-MM-dd')",
          "channel, `day`")),
      Map.entry("q17", new Nexmark(List.of("bid"),
          "auction BIGINT, `day` STRING, " + RANK_COLUMNS + ", "
              + "min_price BIGINT, max_price BIGINT, avg_price BIGINT, sum_price BIGINT",
          "SELECT auction, DATE_FORMAT(date_time, 'yyyy-MM-dd') as `day`,\n"
          + RANK_COUNTS
              + "  min(price) AS min_price,\n"
              + "  max(price) AS max_price,\n"
              + "  avg(price) AS avg_price,\n"
              + "  sum(price) AS sum_price\n"
              + "FROM bid\n"
              + "GROUP BY auction, DATE_FORMAT(date_time, 'yyyy-MM-dd')",
          "auction, `day`")),
      Map.entry("q18", new Nexmark(List.of("bid"),
          "auction BIGINT, bidder BIGINT, price BIGINT, channel STRING, url STRING, "
              + "date_time TIMESTAMP_LTZ(3), extra STRING",
          "SELECT auction, bidder, price, channel, url, date_time, extra\n"
              + "FROM (SELECT *, ROW_NUMBER() OVER (PARTITION BY bidder, auction ORDER BY date_time DESC) AS rank_number\n"
              + "      FROM bid)\n"
              + "WHERE rank_number <= 1",
          "auction, bidder")),
      Map.entry("q19", new Nexmark(List.of("bid"),
          "auction BIGINT, bidder BIGINT, price BIGINT, channel STRING, url STRING, "
              + "date_time TIMESTAMP_LTZ(3), extra STRING, rank_number BIGINT",
          "SELECT * FROM\n"
              + "(SELECT *, ROW_NUMBER() OVER (PARTITION BY auction ORDER BY price DESC) AS rank_number FROM bid)\n"
              + "WHERE rank_number <= 10",
          "auction, rank_number")),
      // The auction's date_time and extra renamed, as in ubik's (one value per JSON name).
      Map.entry("q20", new Nexmark(List.of("bid", "auction"),
          "auction BIGINT, bidder BIGINT, price BIGINT, channel STRING, url STRING, "
              + "date_time TIMESTAMP_LTZ(3), extra STRING, item_name STRING, description STRING, "
              + "initial_bid BIGINT, reserve BIGINT, a_date_time TIMESTAMP_LTZ(3), "
              + "expires TIMESTAMP_LTZ(3), seller BIGINT, category BIGINT, a_extra STRING",
          "SELECT auction, bidder, price, channel, url, B.date_time, B.extra,\n"
              + "  item_name, description, initial_bid, reserve, A.date_time, expires, seller, category, A.extra\n"
              + "FROM bid AS B INNER JOIN auction AS A on B.auction = A.id\n"
              + "WHERE A.category = 10")),
      Map.entry("q21", new Nexmark(List.of("bid"),
          "auction BIGINT, bidder BIGINT, price BIGINT, channel STRING, channel_id STRING",
          "SELECT auction, bidder, price, channel,\n"
              + "  CASE\n"
              + "    WHEN lower(channel) = 'apple' THEN '0'\n"
              + "    WHEN lower(channel) = 'google' THEN '1'\n"
              + "    WHEN lower(channel) = 'facebook' THEN '2'\n"
              + "    WHEN lower(channel) = 'baidu' THEN '3'\n"
              + "    ELSE REGEXP_EXTRACT(url, '(&|^)channel_id=([^&]*)', 2)\n"
              + "  END AS channel_id\n"
              + "FROM bid\n"
              + "WHERE REGEXP_EXTRACT(url, '(&|^)channel_id=([^&]*)', 2) is not null or\n"
              + "  lower(channel) in ('apple', 'google', 'facebook', 'baidu')")),
      Map.entry("q22", new Nexmark(List.of("bid"),
          "auction BIGINT, bidder BIGINT, price BIGINT, channel STRING, "
              + "dir1 STRING, dir2 STRING, dir3 STRING",
          "SELECT auction, bidder, price, channel,\n"
              + "  SPLIT_INDEX(url, '/', 3) as dir1,\n"
              + "  SPLIT_INDEX(url, '/', 4) as dir2,\n"
              + "  SPLIT_INDEX(url, '/', 5) as dir3\n"
              + "FROM bid")));

  private static void nexmark(String name, String broker, String out, Map<String, String> opts)
      throws Exception {
    PrintStream result = System.out;
    System.setOut(System.err);
    Nexmark q = QUERIES.get(name);
    if (q == null) {
      throw new IllegalArgumentException("unknown Nexmark query " + name + "; known: "
          + QUERIES.keySet().stream().sorted().collect(Collectors.joining(", ")));
    }
    long lateness = Long.parseLong(opts.getOrDefault("lateness_ms", "5000"));
    TableEnvironment t = env("ubik-bench-nexmark-" + name);
    String registry = opts.get("registry");
    String watermark = "INTERVAL '"
        + String.format(Locale.ROOT, "%d.%03d", lateness / 1000, lateness % 1000) + "' SECOND";
    for (String table : q.tables()) {
      String topic = opts.get(table);
      if (topic == null) throw new IllegalArgumentException(name + " reads " + table + ": pass " + table + "=TOPIC");
      if (registry == null) {
        t.executeSql("CREATE TABLE " + table + " (\n"
            + TABLES.get(table)
            + "  WATERMARK FOR date_time AS date_time - " + watermark + "\n"
            + ") WITH (\n"
            + source(broker, topic)
            + ")");
      } else {
        avroTable(t, table, broker, topic, registry, watermark);
      }
    }
    if (q.upsertKey() == null) {
      t.executeSql("CREATE TABLE sink (" + q.sinkColumns() + ") WITH (\n"
          + "  'connector' = 'kafka',\n"
          + "  'topic' = " + lit(out) + ",\n"
          + "  'properties.bootstrap.servers' = " + lit(broker) + ",\n"
          + COMPRESSION
          + "  'format' = 'json',\n"
          + "  'json.timestamp-format.standard' = 'ISO-8601'\n"
          + ")");
    } else {
      t.executeSql("CREATE TABLE sink (" + q.sinkColumns()
          + ", PRIMARY KEY (" + q.upsertKey() + ") NOT ENFORCED) WITH (\n"
          + upsertSink(broker, out)
          + ")");
    }
    if (opts.containsKey("out_partitions")) {
      createTopic(broker, out, Integer.parseInt(opts.get("out_partitions")));
    }
    String insert = "INSERT INTO sink\n" + q.select();
    System.err.println("FlinkPeer " + name + ":\n" + insert);
    execute(t, insert, broker, out, result);
  }

  /**
   * Table `table` over `topic` in Confluent-framed Avro as ubik writes it (`format=avro`, schema
   * in `registry`): Flink's 'avro-confluent' format. ubik writes TIMESTAMP as `timestamp-micros`,
   * which this format's (legacy) type mapping cannot read into any timestamp type, so the column
   * is read as its long and the query's table is a view of the raw topic with the event time
   * made of it (exact: the values are whole milliseconds).
   */
  private static void avroTable(TableEnvironment t, String table, String broker, String topic,
      String registry, String watermark) {
    String columns = TABLES.get(table).replace("TIMESTAMP_LTZ(3)", "BIGINT");
    List<String> names = Stream.of(TABLES.get(table).split(",\n"))
        .map(c -> c.trim().split(" ")[0]).filter(c -> !c.isEmpty()).toList();
    t.executeSql("CREATE TABLE " + table + "_avro (\n"
        + columns
        + "  event_time AS TO_TIMESTAMP_LTZ(date_time / 1000, 3),\n"
        + "  WATERMARK FOR event_time AS event_time - " + watermark + "\n"
        + ") WITH (\n"
        + source(broker, topic, "  'format' = 'avro-confluent',\n"
            + "  'avro-confluent.url' = " + lit(registry) + "\n")
        + ")");
    t.executeSql("CREATE VIEW " + table + " AS SELECT "
        + names.stream().map(c -> c.equals("date_time") ? "event_time AS date_time" : c)
            .collect(Collectors.joining(", "))
        + " FROM " + table + "_avro");
  }

  /** Runs the INSERT to its end and prints the result line. */
  private static void execute(TableEnvironment t, String insert, String broker, String out,
      PrintStream result) throws Exception {
    Long before = endOffsets(broker, out);
    long start = System.nanoTime();
    TableResult submitted = t.executeSql(insert);
    // The job finishes once the bounded source is exhausted, every window has fired and the
    // Kafka sink has flushed its producer (it does so at end of input).
    JobExecutionResult job = submitted.getJobClient().orElseThrow().getJobExecutionResult().get();
    double seconds = (System.nanoTime() - start) / 1e9;
    double cpu = processCpuSeconds();
    Long after = endOffsets(broker, out);
    String records = before == null || after == null ? "null" : Long.toString(after - before);

    result.printf(Locale.ROOT, "{\"bench\":\"flink\",\"seconds\":%.3f,\"job_runtime_seconds\":%.3f,"
            + "\"output_records\":%s,\"cpu_seconds\":%.3f}%n",
        seconds, job.getNetRuntime(TimeUnit.MILLISECONDS) / 1e3, records, cpu);
    result.flush();
  }

  /** CPU time of this JVM, all threads, or NaN if the JVM does not tell. */
  private static double processCpuSeconds() {
    if (ManagementFactory.getOperatingSystemMXBean()
        instanceof com.sun.management.OperatingSystemMXBean os) {
      long ns = os.getProcessCpuTime();
      return ns < 0 ? Double.NaN : ns / 1e9;
    }
    return Double.NaN;
  }

  /** The number of committed records of the topic. */
  private static long count(String broker, String topic) {
    Properties p = new Properties();
    p.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, broker);
    p.put(ConsumerConfig.ISOLATION_LEVEL_CONFIG, "read_committed");
    p.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, "false");
    p.put(ConsumerConfig.MAX_POLL_RECORDS_CONFIG, "10000");
    long n = 0;
    try (KafkaConsumer<byte[], byte[]> c =
        new KafkaConsumer<>(p, new ByteArrayDeserializer(), new ByteArrayDeserializer())) {
      List<TopicPartition> parts = new ArrayList<>();
      for (PartitionInfo i : c.partitionsFor(topic, Duration.ofSeconds(30))) {
        parts.add(new TopicPartition(topic, i.partition()));
      }
      c.assign(parts);
      c.seekToBeginning(parts);
      // read_committed: the end offsets are the last stable offsets.
      Map<TopicPartition, Long> end = new HashMap<>(c.endOffsets(parts));
      while (true) {
        end.entrySet().removeIf(e -> c.position(e.getKey()) >= e.getValue());
        if (end.isEmpty()) break;
        ConsumerRecords<byte[], byte[]> r = c.poll(Duration.ofSeconds(1));
        n += r.count();
      }
    }
    return n;
  }

  /** Creates the topic with this many partitions (replication 1) unless it exists. */
  private static void createTopic(String broker, String topic, int partitions) throws Exception {
    Properties p = new Properties();
    p.put(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG, broker);
    try (Admin admin = Admin.create(p)) {
      if (admin.listTopics().names().get().contains(topic)) return;
      admin.createTopics(List.of(new NewTopic(topic, partitions, (short) 1))).all().get();
    }
  }

  /** Deletes the topics that exist. */
  private static void delete(String broker, List<String> topics) throws Exception {
    Properties p = new Properties();
    p.put(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG, broker);
    try (Admin admin = Admin.create(p)) {
      List<String> present = new ArrayList<>(topics);
      present.retainAll(admin.listTopics().names().get());
      admin.deleteTopics(present).all().get();
    }
  }

  /** A SQL string literal. */
  private static String lit(String s) {
    return "'" + s.replace("'", "''") + "'";
  }

  /** Sum of the topic's end offsets (0 if it does not exist yet), or null if unknown. */
  private static Long endOffsets(String broker, String topic) {
    Properties p = new Properties();
    p.put(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG, broker);
    try (Admin admin = Admin.create(p)) {
      TopicDescription d = admin.describeTopics(List.of(topic)).allTopicNames().get().get(topic);
      Map<TopicPartition, OffsetSpec> latest = d.partitions().stream().collect(Collectors.toMap(
          tp -> new TopicPartition(topic, tp.partition()), tp -> OffsetSpec.latest()));
      return admin.listOffsets(latest).all().get().values().stream()
          .mapToLong(o -> o.offset()).sum();
    } catch (ExecutionException e) {
      if (e.getCause() instanceof UnknownTopicOrPartitionException) return 0L;
      System.err.println("FlinkPeer: cannot read the end offsets of " + topic + ": " + e.getCause());
      return null;
    } catch (Exception e) {
      System.err.println("FlinkPeer: cannot read the end offsets of " + topic + ": " + e);
      return null;
    }
  }
}
