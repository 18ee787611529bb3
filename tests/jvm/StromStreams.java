// A Kafka Streams word count with exactly-once processing (exactly_once_v2), for
// tests/kafka/test_streams_eos.py. Compiled with javac next to the jars of target/jvm/lib
// (or run from source, like StromClient.java):
//
//   java -cp 'target/jvm/lib/*' tests/jvm/StromStreams.java BOOTSTRAP APP_ID INPUT OUTPUT STATE_DIR THREADS
//
// Lines from INPUT (string values) are split into lower-case words, grouped by word (a
// repartition topic), and counted in a persistent state store (RocksDB, with a compacted
// changelog topic); every count update goes to OUTPUT as <word, count> (string key, 8-byte
// big-endian long value). The record cache is off, so each input word gives one update.
// Internal topics are created with replication factor 3 and min.insync.replicas=2.
//
// Prints "STATE <old> <new>" on each state change of the Streams client and
// "UNCAUGHT <exception>" for an exception that stops a stream thread. Exits 1 when the
// client goes to ERROR; the end of stdin closes it ("CLOSED <true if within 60 s>", exit
// 0, or 3 when the close timed out).

import java.time.Duration;
import java.util.Arrays;
import java.util.Properties;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.atomic.AtomicBoolean;

import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.streams.KafkaStreams;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.StreamsConfig;
import org.apache.kafka.streams.errors.StreamsUncaughtExceptionHandler;
import org.apache.kafka.streams.kstream.Consumed;
import org.apache.kafka.streams.kstream.Grouped;
import org.apache.kafka.streams.kstream.Materialized;
import org.apache.kafka.streams.kstream.Produced;

public class StromStreams {
    public static void main(String[] args) throws Exception {
        if (args.length != 6) {
            System.err.println("usage: BOOTSTRAP APP_ID INPUT OUTPUT STATE_DIR THREADS");
            System.exit(2);
        }
        Properties props = new Properties();
        props.put(StreamsConfig.BOOTSTRAP_SERVERS_CONFIG, args[0]);
        props.put(StreamsConfig.APPLICATION_ID_CONFIG, args[1]);
        props.put(StreamsConfig.STATE_DIR_CONFIG, args[4]);
        props.put(StreamsConfig.NUM_STREAM_THREADS_CONFIG, args[5]);
        props.put(StreamsConfig.PROCESSING_GUARANTEE_CONFIG, StreamsConfig.EXACTLY_ONCE_V2);
        props.put(StreamsConfig.STATESTORE_CACHE_MAX_BYTES_CONFIG, "0");
        props.put(StreamsConfig.REPLICATION_FACTOR_CONFIG, "3");
        props.put(StreamsConfig.topicPrefix("min.insync.replicas"), "2");
        props.put(StreamsConfig.DEFAULT_KEY_SERDE_CLASS_CONFIG, Serdes.StringSerde.class.getName());
        props.put(StreamsConfig.DEFAULT_VALUE_SERDE_CLASS_CONFIG, Serdes.StringSerde.class.getName());

        StreamsBuilder builder = new StreamsBuilder();
        builder.stream(args[2], Consumed.with(Serdes.String(), Serdes.String()))
            .flatMapValues(line -> Arrays.asList(line.toLowerCase().split("\\W+")))
            .filter((key, word) -> !word.isEmpty())
            .groupBy((key, word) -> word, Grouped.with("words", Serdes.String(), Serdes.String()))
            .count(Materialized.as("counts"))
            .toStream()
            .to(args[3], Produced.with(Serdes.String(), Serdes.Long()));

        KafkaStreams streams = new KafkaStreams(builder.build(), props);
        CountDownLatch stopped = new CountDownLatch(1);
        AtomicBoolean failed = new AtomicBoolean(false);
        streams.setStateListener((next, old) -> {
            System.out.println("STATE " + old + " " + next);
            if (next == KafkaStreams.State.ERROR) {
                failed.set(true);
                stopped.countDown();
            } else if (next == KafkaStreams.State.NOT_RUNNING) {
                stopped.countDown();
            }
        });
        streams.setUncaughtExceptionHandler(e -> {
            System.out.println("UNCAUGHT " + e.toString().replace('\n', ' '));
            e.printStackTrace();
            return StreamsUncaughtExceptionHandler.StreamThreadExceptionResponse.SHUTDOWN_CLIENT;
        });
        streams.start();
        // The end of stdin stops the application cleanly (its last transaction committed).
        Thread stdin = new Thread(() -> {
            try {
                while (System.in.read() >= 0) {
                    // wait for the end of stdin
                }
            } catch (java.io.IOException e) {
                // as the end of stdin
            }
            boolean clean = streams.close(Duration.ofSeconds(60));
            System.out.println("CLOSED " + clean);
            System.exit(clean ? 0 : 3);
        });
        stdin.setDaemon(true);
        stdin.start();
        stopped.await();
        if (failed.get()) {
            streams.close(Duration.ofSeconds(10));
            System.exit(1);
        }
        stdin.join();  // NOT_RUNNING: a close is under way; it exits
    }
}
