// Kafka transactions with the reference Java client (kafka-clients), for
// tests/kafka/test_java_transactions.py. Compiled with javac next to the jars of
// target/jvm/lib (or run from source, like StromClient.java):
//
//   java -cp 'target/jvm/lib/*' tests/jvm/StromTxn.java COMMAND BOOTSTRAP ...
//
// Every command prints one line per fact the test checks, words separated by single
// spaces, and exits 1 (with the reason on stderr) when something fails that should not.
//
// commit-abort BOOTSTRAP TOPIC PARTITIONS TXN_PREFIX
//   Two transactional producers (TXN_PREFIX-0 and -1) run four rounds of concurrent
//   transactions over every partition, their records interleaved (each chunk acknowledged
//   before the other producer's next one), ending them (commit, abort), (abort, commit),
//   (commit, commit), (abort, abort). Prints "P <C|A> <partition> <offset> <value>" per
//   record as delivered, then what a read_committed and a read_uncommitted consumer read
//   from the start to the end offsets (lines "RC|RU <partition> <offset> <value>", after
//   "END <RC|RU> <partition> <end offset>").
//
// fence BOOTSTRAP TOPIC TXN_ID
//   Producer A opens a transaction and writes 5 records to partition 0; producer B
//   initializes the same transactional id ("END AFTER-INIT 0 <read_committed end>"); A's
//   commit fails ("FENCED <exception class>", or "NOT-FENCED" if it succeeds); A cannot
//   begin again ("FENCED-AGAIN <exception class>"); B commits 5 records. Prints "P <A|B>
//   0 <offset> <value>" as delivered and what both isolation levels read, as commit-abort.
//
// rpw BOOTSTRAP IN OUT PARTITIONS GROUP TXN_ID COUNT TIMEOUT_S
//   A read-process-write loop: a group member (read_committed, at most 40 records a poll)
//   reads IN, and for each poll a transaction writes "out:<value>" with the same key to the
//   same partition of OUT and commits the member's positions (sendOffsetsToTransaction with
//   groupMetadata()). Every 7th transaction (the 3rd, 10th, ...) is aborted on purpose once
//   its records are written ("ABORTED-ON-PURPOSE <records>"). Prints "COMMITTED <records
//   so far>" after each commit, "RETRY ..." when a commit or abort times out and is called
//   again, and "ABORTED <exception>" when a transaction fails and is aborted. After an
//   abort the member rewinds to the last committed positions. Stops once COUNT records are
//   committed; prints the group's committed offsets ("GROUP <partition> <offset>") and OUT
//   as a read_committed and a read_uncommitted consumer read it ("RC|RU ..." lines, as
//   commit-abort). Exits 1 after TIMEOUT_S.
//
// hold BOOTSTRAP TOPIC TXN_ID
//   Opens a transaction with 3 records on partitions 0 and 1 ("P T <partition> <offset>
//   <value>"), prints "OPEN", and waits for a line on stdin: "commit" commits it and
//   prints "COMMITTED", then the process waits for the end of stdin and exits.

import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.time.Duration;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.HashSet;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.concurrent.Future;

import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.ConsumerRecords;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.consumer.OffsetAndMetadata;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.clients.producer.RecordMetadata;
import org.apache.kafka.common.KafkaException;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.errors.AuthorizationException;
import org.apache.kafka.common.errors.OutOfOrderSequenceException;
import org.apache.kafka.common.errors.ProducerFencedException;
import org.apache.kafka.common.errors.TimeoutException;
import org.apache.kafka.common.serialization.StringDeserializer;
import org.apache.kafka.common.serialization.StringSerializer;

public class StromTxn {
    public static void main(String[] args) throws Exception {
        if (args.length < 1) {
            usage();
        }
        switch (args[0]) {
            case "commit-abort" -> commitAbort(args);
            case "fence" -> fence(args);
            case "rpw" -> readProcessWrite(args);
            case "hold" -> hold(args);
            default -> usage();
        }
    }

    static void usage() {
        System.err.println("usage: commit-abort BOOTSTRAP TOPIC PARTITIONS TXN_PREFIX | fence BOOTSTRAP TOPIC TXN_ID"
            + " | rpw BOOTSTRAP IN OUT PARTITIONS GROUP TXN_ID COUNT TIMEOUT_S | hold BOOTSTRAP TOPIC TXN_ID");
        System.exit(2);
    }

    static void fail(String why) {
        System.err.println(why);
        System.exit(1);
    }

    static KafkaProducer<String, String> transactional(String bootstrap, String txnId) {
        Properties props = new Properties();
        props.put("bootstrap.servers", bootstrap);
        props.put("transactional.id", txnId);
        props.put("linger.ms", "5");
        props.put("key.serializer", StringSerializer.class.getName());
        props.put("value.serializer", StringSerializer.class.getName());
        return new KafkaProducer<>(props);
    }

    static KafkaConsumer<String, String> consumer(String bootstrap, String isolation, String group) {
        return consumer(bootstrap, isolation, group, "500");
    }

    static KafkaConsumer<String, String> consumer(String bootstrap, String isolation, String group,
                                                  String maxPollRecords) {
        Properties props = new Properties();
        props.put("bootstrap.servers", bootstrap);
        props.put("isolation.level", isolation);
        props.put("enable.auto.commit", "false");
        props.put("auto.offset.reset", "earliest");
        props.put("max.poll.records", maxPollRecords);
        props.put("key.deserializer", StringDeserializer.class.getName());
        props.put("value.deserializer", StringDeserializer.class.getName());
        if (group != null) {
            props.put("group.id", group);
        }
        return new KafkaConsumer<>(props);
    }

    static List<TopicPartition> partitions(String topic, int n) {
        List<TopicPartition> out = new ArrayList<>();
        for (int p = 0; p < n; p++) {
            out.add(new TopicPartition(topic, p));
        }
        return out;
    }

    /** Sends each {partition, value} and waits for all; prints "P <tag> <partition> <offset> <value>". */
    static void sendAll(KafkaProducer<String, String> producer, String topic, String tag, List<Object[]> records)
            throws Exception {
        List<Future<RecordMetadata>> sent = new ArrayList<>();
        for (Object[] r : records) {
            sent.add(producer.send(new ProducerRecord<>(topic, (Integer) r[0], null, (String) r[1])));
        }
        producer.flush();
        for (int i = 0; i < records.size(); i++) {
            RecordMetadata md = sent.get(i).get();
            System.out.println("P " + tag + " " + md.partition() + " " + md.offset() + " " + records.get(i)[1]);
        }
    }

    /** Reads TOPIC from the start to the end offsets at an isolation level, printing what it reads. */
    static void readAll(String bootstrap, String topic, int n, String isolation, String tag, long timeoutMs) {
        try (KafkaConsumer<String, String> c = consumer(bootstrap, isolation, null)) {
            List<TopicPartition> tps = partitions(topic, n);
            c.assign(tps);
            c.seekToBeginning(tps);
            Map<TopicPartition, Long> end = c.endOffsets(tps, Duration.ofSeconds(30));
            for (TopicPartition tp : tps) {
                System.out.println("END " + tag + " " + tp.partition() + " " + end.get(tp));
            }
            long deadline = System.currentTimeMillis() + timeoutMs;
            while (true) {
                boolean done = true;
                for (TopicPartition tp : tps) {
                    if (c.position(tp) < end.get(tp)) {
                        done = false;
                    }
                }
                if (done) {
                    break;
                }
                if (System.currentTimeMillis() > deadline) {
                    StringBuilder at = new StringBuilder();
                    for (TopicPartition tp : tps) {
                        at.append(" ").append(tp.partition()).append(":").append(c.position(tp)).append("/")
                            .append(end.get(tp));
                    }
                    fail(tag + ": timed out reading " + topic + " at positions" + at);
                }
                for (ConsumerRecord<String, String> r : c.poll(Duration.ofMillis(200))) {
                    System.out.println(tag + " " + r.partition() + " " + r.offset() + " " + r.value());
                }
            }
        }
    }

    static void commitAbort(String[] args) throws Exception {
        if (args.length != 5) {
            usage();
        }
        String bootstrap = args[1], topic = args[2], prefix = args[4];
        int n = Integer.parseInt(args[3]);
        boolean[][] rounds = {{true, false}, {false, true}, {true, true}, {false, false}};
        List<KafkaProducer<String, String>> producers = new ArrayList<>();
        try {
            for (int k = 0; k < 2; k++) {
                KafkaProducer<String, String> p = transactional(bootstrap, prefix + "-" + k);
                producers.add(p);
                p.initTransactions();
            }
            for (int r = 0; r < rounds.length; r++) {
                for (KafkaProducer<String, String> p : producers) {
                    p.beginTransaction();
                }
                for (int chunk = 0; chunk < 2; chunk++) {
                    for (int k = 0; k < 2; k++) {
                        List<Object[]> records = new ArrayList<>();
                        for (int part = 0; part < n; part++) {
                            for (int i = 0; i < 5; i++) {
                                records.add(new Object[]{part,
                                    "round" + r + "-producer" + k + "-chunk" + chunk + "-part" + part + "-" + i});
                            }
                        }
                        sendAll(producers.get(k), topic, rounds[r][k] ? "C" : "A", records);
                    }
                }
                for (int k = 0; k < 2; k++) {
                    if (rounds[r][k]) {
                        producers.get(k).commitTransaction();
                    } else {
                        producers.get(k).abortTransaction();
                    }
                }
            }
        } finally {
            for (KafkaProducer<String, String> p : producers) {
                p.close(Duration.ofSeconds(10));
            }
        }
        readAll(bootstrap, topic, n, "read_committed", "RC", 60_000);
        readAll(bootstrap, topic, n, "read_uncommitted", "RU", 60_000);
    }

    static void fence(String[] args) throws Exception {
        if (args.length != 4) {
            usage();
        }
        String bootstrap = args[1], topic = args[2], txnId = args[3];
        try (KafkaProducer<String, String> a = transactional(bootstrap, txnId);
             KafkaProducer<String, String> b = transactional(bootstrap, txnId)) {
            a.initTransactions();
            a.beginTransaction();
            List<Object[]> zombie = new ArrayList<>();
            for (int i = 0; i < 5; i++) {
                zombie.add(new Object[]{0, "zombie-" + i});
            }
            sendAll(a, topic, "A", zombie);
            b.initTransactions();
            try (KafkaConsumer<String, String> c = consumer(bootstrap, "read_committed", null)) {
                TopicPartition tp = new TopicPartition(topic, 0);
                System.out.println("END AFTER-INIT 0 " + c.endOffsets(List.of(tp), Duration.ofSeconds(30)).get(tp));
            }
            try {
                a.commitTransaction();
                System.out.println("NOT-FENCED");
            } catch (KafkaException e) {
                System.out.println("FENCED " + e.getClass().getName());
            }
            try {
                a.beginTransaction();
                System.out.println("NOT-FENCED-AGAIN");
            } catch (RuntimeException e) {
                System.out.println("FENCED-AGAIN " + e.getClass().getName());
            }
            b.beginTransaction();
            List<Object[]> fresh = new ArrayList<>();
            for (int i = 0; i < 5; i++) {
                fresh.add(new Object[]{0, "fresh-" + i});
            }
            sendAll(b, topic, "B", fresh);
            b.commitTransaction();
        }
        readAll(bootstrap, topic, 1, "read_committed", "RC", 60_000);
        readAll(bootstrap, topic, 1, "read_uncommitted", "RU", 60_000);
    }

    static void readProcessWrite(String[] args) throws Exception {
        if (args.length != 9) {
            usage();
        }
        String bootstrap = args[1], in = args[2], out = args[3], group = args[5], txnId = args[6];
        int n = Integer.parseInt(args[4]);
        long count = Long.parseLong(args[7]);
        long deadline = System.currentTimeMillis() + Long.parseLong(args[8]) * 1000;
        // What the group has committed, as this member knows it: where to rewind after an abort.
        Map<TopicPartition, Long> committed = new HashMap<>();
        try (KafkaConsumer<String, String> consumer = consumer(bootstrap, "read_committed", group, "40");
             KafkaProducer<String, String> producer = transactional(bootstrap, txnId)) {
            producer.initTransactions();
            consumer.subscribe(List.of(in));
            long done = 0, transactions = 0;
            while (done < count) {
                if (System.currentTimeMillis() > deadline) {
                    fail("timed out with " + done + " of " + count + " records committed");
                }
                ConsumerRecords<String, String> records = consumer.poll(Duration.ofMillis(200));
                if (records.isEmpty()) {
                    continue;
                }
                Map<TopicPartition, OffsetAndMetadata> next = new HashMap<>();
                try {
                    producer.beginTransaction();
                    for (ConsumerRecord<String, String> r : records) {
                        producer.send(new ProducerRecord<>(out, r.partition(), r.key(), "out:" + r.value()));
                        next.put(new TopicPartition(r.topic(), r.partition()), new OffsetAndMetadata(r.offset() + 1));
                    }
                    producer.sendOffsetsToTransaction(next, consumer.groupMetadata());
                    if (++transactions % 7 == 3) {
                        producer.flush();  // the records are in the log before the abort
                        abort(producer, deadline);
                        rewind(consumer, committed);
                        System.out.println("ABORTED-ON-PURPOSE " + records.count());
                        continue;
                    }
                    commit(producer, deadline);
                } catch (ProducerFencedException | OutOfOrderSequenceException | AuthorizationException e) {
                    throw e;  // fatal: the test fails
                } catch (KafkaException e) {
                    System.out.println("ABORTED " + e);
                    abort(producer, deadline);
                    rewind(consumer, committed);
                    continue;
                }
                for (Map.Entry<TopicPartition, OffsetAndMetadata> e : next.entrySet()) {
                    committed.put(e.getKey(), e.getValue().offset());
                }
                done = committed.values().stream().mapToLong(Long::longValue).sum();
                System.out.println("COMMITTED " + done);
            }
            List<TopicPartition> inputs = partitions(in, n);
            Map<TopicPartition, OffsetAndMetadata> offsets = consumer.committed(new HashSet<>(inputs),
                Duration.ofSeconds(30));
            for (TopicPartition tp : inputs) {
                OffsetAndMetadata at = offsets.get(tp);
                System.out.println("GROUP " + tp.partition() + " " + (at == null ? -1 : at.offset()));
            }
        }
        readAll(bootstrap, out, n, "read_committed", "RC", 60_000);
        readAll(bootstrap, out, n, "read_uncommitted", "RU", 60_000);
    }

    /** Moves the member back to the positions its group last committed. */
    static void rewind(KafkaConsumer<String, String> consumer, Map<TopicPartition, Long> committed) {
        for (TopicPartition tp : consumer.assignment()) {
            Long at = committed.get(tp);
            if (at != null) {
                consumer.seek(tp, at);
            } else {
                consumer.seekToBeginning(List.of(tp));
            }
        }
    }

    /** commitTransaction, again after a timeout (Kafka's advice: the commit resumes). */
    static void commit(KafkaProducer<String, String> producer, long deadline) {
        while (true) {
            try {
                producer.commitTransaction();
                return;
            } catch (TimeoutException e) {
                if (System.currentTimeMillis() > deadline) {
                    throw e;
                }
                System.out.println("RETRY commit " + e);
            }
        }
    }

    static void abort(KafkaProducer<String, String> producer, long deadline) {
        while (true) {
            try {
                producer.abortTransaction();
                return;
            } catch (TimeoutException e) {
                if (System.currentTimeMillis() > deadline) {
                    throw e;
                }
                System.out.println("RETRY abort " + e);
            }
        }
    }

    static void hold(String[] args) throws Exception {
        if (args.length != 4) {
            usage();
        }
        String bootstrap = args[1], topic = args[2], txnId = args[3];
        BufferedReader stdin = new BufferedReader(new InputStreamReader(System.in));
        try (KafkaProducer<String, String> p = transactional(bootstrap, txnId)) {
            p.initTransactions();
            p.beginTransaction();
            List<Object[]> records = new ArrayList<>();
            for (int part = 0; part < 2; part++) {
                for (int i = 0; i < 3; i++) {
                    records.add(new Object[]{part, "held-" + part + "-" + i});
                }
            }
            sendAll(p, topic, "T", records);
            System.out.println("OPEN");
            String line = stdin.readLine();
            if (!"commit".equals(line)) {
                fail("expected \"commit\" on stdin, got " + line);
            }
            p.commitTransaction();
            System.out.println("COMMITTED");
            while (stdin.readLine() != null) {
                // wait for the end of stdin
            }
        }
    }
}
