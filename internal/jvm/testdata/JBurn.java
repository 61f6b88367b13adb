// JBurn burns CPU in a known call chain so that a profiler's view of it
// can be checked: main -> jAlpha -> jBeta -> jGammaBurn, with small static
// methods (Mix) that C2 inlines into jGammaBurn.
public class JBurn {
    static volatile long sink;

    public static void main(String[] args) throws Exception {
        long seconds = args.length > 0 ? Long.parseLong(args[0]) : 30;
        long end = System.nanoTime() + seconds * 1_000_000_000L;
        // A lambda called often enough to be compiled: its hidden class
        // gets a name only HotSpot gives.
        Runnable tick = () -> sink++;
        for (int i = 0; i < 50_000; i++) {
            tick.run();
        }
        System.out.println("ready");
        System.out.flush();
        while (System.nanoTime() < end) {
            sink += jAlpha(2000);
        }
    }

    static long jAlpha(int n) {
        long s = 0;
        for (int i = 0; i < 4; i++) {
            s += jBeta(n + i);
        }
        return s;
    }

    static long jBeta(int n) {
        return jGammaBurn(n) ^ n;
    }

    static long jGammaBurn(int n) {
        long acc = 17;
        for (int i = 0; i < n; i++) {
            acc = Mix.step(acc, i);
            if ((acc & 0xFFFF) == 0x1234) {
                acc = Mix.fold(acc);
            }
        }
        return acc;
    }

    static final class Mix {
        static long step(long a, int i) {
            return rotate(a * 31 + i);
        }

        static long rotate(long v) {
            return (v << 7) | (v >>> 57);
        }

        static long fold(long a) {
            return a ^ (a >>> 29);
        }
    }
}
