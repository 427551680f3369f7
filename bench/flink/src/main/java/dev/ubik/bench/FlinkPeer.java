/*
 * Flink SQL peer of bench/kafka.sh: runs the per-merchant per-minute tumbling-window query with
 * Flink SQL in a local mini-cluster (embedded in this JVM), Kafka to Kafka.
 *
 *   FlinkPeer BROKER IN_TOPIC OUT_TOPIC
 *
 * Reads IN_TOPIC (JSON {"merchant","ts","amount"}) from the earliest offsets up to the latest
 * offsets at start (a bounded job), event time ts with zero lateness, and writes an upsert
 * changelog keyed by (merchant, window_start) to OUT_TOPIC (JSON key and value). Prints one
 * JSON line to stdout:
 *   {"bench":"flink","seconds":S,"job_runtime_seconds":R,"output_records":N|null}
 * S: from submitting the INSERT (planning, mini-cluster start, run) until the job finished,
 * with all output flushed; R: Flink's own net runtime of the job; N: records appended to
 * OUT_TOPIC during the run (its end offsets after minus before). Logs go to stderr.
 * System properties: parallelism (default 2).
 */
package dev.ubik.bench;

import java.io.PrintStream;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import java.util.Properties;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.TimeUnit;
import java.util.stream.Collectors;
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
import org.apache.kafka.clients.admin.OffsetSpec;
import org.apache.kafka.clients.admin.TopicDescription;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.errors.UnknownTopicOrPartitionException;

public final class FlinkPeer {
  public static void main(String[] args) {
    if (args.length != 3) {
      System.err.println("usage: FlinkPeer BROKER IN_TOPIC OUT_TOPIC");
      System.exit(2);
    }
    try {
      run(args[0], args[1], args[2]);
    } catch (Throwable e) {
      e.printStackTrace();
      System.exit(1); // the mini-cluster's threads would keep the JVM alive
    }
    System.exit(0); // likewise after success
  }

  private static void run(String broker, String in, String out) throws Exception {
    // stdout carries only the result line: anything else printed goes to stderr.
    PrintStream result = System.out;
    System.setOut(System.err);

    Configuration conf = new Configuration();
    conf.set(CoreOptions.DEFAULT_PARALLELISM, Integer.getInteger("parallelism", 2));
    conf.set(PipelineOptions.NAME, "ubik-bench-flink");
    conf.set(PipelineOptions.OBJECT_REUSE, true); // no defensive copies between chained operators
    // Windows and TIMESTAMP_LTZ rendering in UTC, whatever the machine's zone.
    conf.set(TableConfigOptions.LOCAL_TIME_ZONE, "UTC");
    TableEnvironment t = TableEnvironment.create(
        EnvironmentSettings.newInstance().inStreamingMode().withConfiguration(conf).build());

    // 'Z'-suffixed ISO-8601 timestamps parse as TIMESTAMP_LTZ with the ISO-8601 JSON standard.
    t.executeSql("CREATE TABLE src (\n"
        + "  merchant STRING,\n"
        + "  ts TIMESTAMP_LTZ(3),\n"
        + "  amount DOUBLE,\n"
        + "  WATERMARK FOR ts AS ts\n"
        + ") WITH (\n"
        + "  'connector' = 'kafka',\n"
        + "  'topic' = " + lit(in) + ",\n"
        + "  'properties.bootstrap.servers' = " + lit(broker) + ",\n"
        + "  'scan.startup.mode' = 'earliest-offset',\n"
        + "  'scan.bounded.mode' = 'latest-offset',\n"
        + "  'format' = 'json',\n"
        + "  'json.timestamp-format.standard' = 'ISO-8601'\n"
        + ")");
    t.executeSql("CREATE TABLE sink (\n"
        + "  merchant STRING,\n"
        + "  window_start TIMESTAMP(3),\n"
        + "  n BIGINT,\n"
        + "  total DOUBLE,\n"
        + "  mean DOUBLE,\n"
        + "  PRIMARY KEY (merchant, window_start) NOT ENFORCED\n"
        + ") WITH (\n"
        + "  'connector' = 'upsert-kafka',\n"
        + "  'topic' = " + lit(out) + ",\n"
        + "  'properties.bootstrap.servers' = " + lit(broker) + ",\n"
        + "  'key.format' = 'json',\n"
        + "  'key.json.timestamp-format.standard' = 'ISO-8601',\n"
        + "  'value.format' = 'json',\n"
        + "  'value.json.timestamp-format.standard' = 'ISO-8601'\n"
        + ")");
    String query = "INSERT INTO sink\n"
        + "SELECT merchant, window_start, COUNT(*) AS n, SUM(amount) AS total, AVG(amount) AS mean\n"
        + "FROM TABLE(TUMBLE(TABLE src, DESCRIPTOR(ts), INTERVAL '1' MINUTE))\n"
        + "GROUP BY merchant, window_start, window_end";

    Long before = endOffsets(broker, out);
    long start = System.nanoTime();
    TableResult submitted = t.executeSql(query);
    // The job finishes once the bounded source is exhausted, every window has fired and the
    // Kafka sink has flushed its producer (it does so at end of input).
    JobExecutionResult job = submitted.getJobClient().orElseThrow().getJobExecutionResult().get();
    double seconds = (System.nanoTime() - start) / 1e9;
    Long after = endOffsets(broker, out);
    String records = before == null || after == null ? "null" : Long.toString(after - before);

    result.printf(Locale.ROOT, "{\"bench\":\"flink\",\"seconds\":%.3f,\"job_runtime_seconds\":%.3f,"
            + "\"output_records\":%s}%n",
        seconds, job.getNetRuntime(TimeUnit.MILLISECONDS) / 1e3, records);
    result.flush();
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
