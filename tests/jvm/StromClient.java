// The reference Java client (kafka-clients) as a test client, run from source:
//
//   java -cp 'target/jvm/lib/*' tests/jvm/StromClient.java produce BOOTSTRAP TOPIC COUNT
//   java -cp 'target/jvm/lib/*' tests/jvm/StromClient.java consume BOOTSTRAP TOPIC GROUP COUNT TIMEOUT_S
//
// produce: an idempotent producer (acks=all) sends COUNT records, value "v-<i>", key
//   "k-<i mod 50>", i from the system property strom.first (0); prints one line per record, "<partition> <offset> <value>", and exits
//   1 if any send fails.
// consume: a group member (classic protocol, subscribe) reads until COUNT records came,
//   prints "<partition> <offset> <value>" per record, commits synchronously, and exits 1
//   if TIMEOUT_S passes first.
//
//   java -cp 'target/jvm/lib/*' tests/jvm/StromClient.java member BOOTSTRAP TOPIC GROUP
// member: a long-lived group member that prints one JSON line per event, with the
//   CLOCK_MONOTONIC time `t` in seconds (System.nanoTime on Linux, comparable with
//   other processes' monotonic clocks): {"ev": "assign"|"revoke"|"lost", "parts": [...]}
//   from its rebalance listener, {"ev": "consumed", "values": [...]} before each commit
//   (every half second), {"ev": "closing"} and {"ev": "closed"} around close(), which
//   starts on SIGTERM.
//
// Extra client settings come as KEY=VALUE arguments after the fixed ones.

import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Collection;
import java.util.Properties;
import java.util.concurrent.Future;
import java.util.concurrent.atomic.AtomicBoolean;

import org.apache.kafka.clients.consumer.ConsumerRebalanceListener;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.clients.producer.RecordMetadata;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.errors.WakeupException;
import org.apache.kafka.common.serialization.StringDeserializer;
import org.apache.kafka.common.serialization.StringSerializer;

public class StromClient {
    public static void main(String[] args) throws Exception {
        if (args.length < 1) {
            usage();
        }
        switch (args[0]) {
            case "produce" -> produce(args);
            case "consume" -> consume(args);
            case "member" -> member(args);
            default -> usage();
        }
    }

    static void usage() {
        System.err.println("usage: produce BOOTSTRAP TOPIC COUNT [K=V...] | consume BOOTSTRAP TOPIC GROUP COUNT TIMEOUT_S [K=V...] | member BOOTSTRAP TOPIC GROUP [K=V...]");
        System.exit(2);
    }

    static void extra(Properties props, String[] args, int from) {
        for (int i = from; i < args.length; i++) {
            String[] kv = args[i].split("=", 2);
            props.put(kv[0], kv[1]);
        }
    }

    static void produce(String[] args) throws Exception {
        if (args.length < 4) {
            usage();
        }
        Properties props = new Properties();
        props.put("bootstrap.servers", args[1]);
        props.put("acks", "all");
        props.put("enable.idempotence", "true");
        props.put("linger.ms", "5");
        props.put("key.serializer", StringSerializer.class.getName());
        props.put("value.serializer", StringSerializer.class.getName());
        extra(props, args, 4);
        String topic = args[2];
        int count = Integer.parseInt(args[3]);
        int first = Integer.getInteger("strom.first", 0);
        List<Future<RecordMetadata>> sent = new ArrayList<>();
        try (KafkaProducer<String, String> producer = new KafkaProducer<>(props)) {
            for (int i = 0; i < count; i++) {
                int n = first + i;
                sent.add(producer.send(new ProducerRecord<>(topic, "k-" + (n % 50), "v-" + n)));
            }
            producer.flush();
            int failed = 0;
            for (int i = 0; i < count; i++) {
                try {
                    RecordMetadata md = sent.get(i).get();
                    System.out.println(md.partition() + " " + md.offset() + " v-" + (first + i));
                } catch (Exception e) {
                    failed++;
                    System.err.println("send " + i + " failed: " + e);
                }
            }
            if (failed > 0) {
                System.exit(1);
            }
        }
    }

    /** A group member's settings: from the earliest offset, committing by hand. */
    static Properties consumerProps(String bootstrap, String group) {
        Properties props = new Properties();
        props.put("bootstrap.servers", bootstrap);
        props.put("group.id", group);
        props.put("auto.offset.reset", "earliest");
        props.put("enable.auto.commit", "false");
        props.put("key.deserializer", StringDeserializer.class.getName());
        props.put("value.deserializer", StringDeserializer.class.getName());
        return props;
    }

    static void consume(String[] args) {
        if (args.length < 6) {
            usage();
        }
        Properties props = consumerProps(args[1], args[3]);
        extra(props, args, 6);
        int count = Integer.parseInt(args[4]);
        long deadline = System.nanoTime() + Long.parseLong(args[5]) * 1_000_000_000L;
        int got = 0;
        try (KafkaConsumer<String, String> consumer = new KafkaConsumer<>(props)) {
            consumer.subscribe(List.of(args[2]));
            while (got < count) {
                if (System.nanoTime() > deadline) {
                    System.err.println("timed out with " + got + " of " + count + " records");
                    System.exit(1);
                }
                for (ConsumerRecord<String, String> r : consumer.poll(Duration.ofMillis(200))) {
                    System.out.println(r.partition() + " " + r.offset() + " " + r.value());
                    got++;
                }
            }
            consumer.commitSync();
        }
    }

    static synchronized void emit(String ev, String fields) {
        double t = System.nanoTime() / 1e9;
        System.out.println(String.format("{\"t\": %.6f, \"ev\": \"%s\"%s}", t, ev, fields));
        System.out.flush();
    }

    static String parts(Collection<TopicPartition> ps) {
        List<Integer> sorted = new ArrayList<>();
        for (TopicPartition tp : ps) {
            sorted.add(tp.partition());
        }
        sorted.sort(null);
        return ", \"parts\": " + sorted;
    }

    static void member(String[] args) throws Exception {
        if (args.length < 4) {
            usage();
        }
        Properties props = consumerProps(args[1], args[3]);
        extra(props, args, 4);
        AtomicBoolean stop = new AtomicBoolean(false);
        Thread main = Thread.currentThread();
        KafkaConsumer<String, String> consumer = new KafkaConsumer<>(props);
        Runtime.getRuntime().addShutdownHook(new Thread(() -> {
            stop.set(true);
            consumer.wakeup();
            try {
                main.join(60_000);
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
            }
        }));
        consumer.subscribe(List.of(args[2]), new ConsumerRebalanceListener() {
            public void onPartitionsAssigned(Collection<TopicPartition> ps) {
                emit("assign", parts(ps));
            }

            public void onPartitionsRevoked(Collection<TopicPartition> ps) {
                emit("revoke", parts(ps));
            }

            public void onPartitionsLost(Collection<TopicPartition> ps) {
                emit("lost", parts(ps));
            }
        });
        List<String> values = new ArrayList<>();
        long last = System.nanoTime();
        while (!stop.get()) {
            try {
                for (ConsumerRecord<String, String> r : consumer.poll(Duration.ofMillis(100))) {
                    values.add("\"" + r.value() + "\"");
                }
                if (System.nanoTime() - last >= 500_000_000L) {
                    last = System.nanoTime();
                    if (!values.isEmpty()) {
                        emit("consumed", ", \"values\": " + values);
                        values.clear();
                        consumer.commitSync();
                    }
                }
            } catch (WakeupException e) {
                break;
            } catch (Exception e) {
                emit("commit_error", ", \"error\": \"" + e.getClass().getSimpleName() + "\"");
            }
        }
        if (!values.isEmpty()) {
            emit("consumed", ", \"values\": " + values);
        }
        emit("closing", "");
        consumer.close();
        emit("closed", "");
    }
}
