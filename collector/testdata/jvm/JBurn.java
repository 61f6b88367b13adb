// JBurn: main -> jAlpha -> jBeta -> jGammaBurn, a CPU loop on the main Java
// thread. It prints "ready" before the chain starts. Lines marked
// "// MARK name" are read by the tests: keep each method's marks on its
// first and last lines and the call marks on the calls.
//
// Modes (first argument):
//   burn: jGammaBurn runs until the process is killed.
//   mix SECONDS: jBeta alternates jGammaBurn (two parts of the work) and
//     jDeltaBurn (one part) for SECONDS, then exits; its leaves return often
//     but jBeta stays interpreted (called once, few loop turns), so neither
//     leaf is inlined into it.
public class JBurn {
    static volatile long sink;

    public static void main(String[] args) { // MARK main
        String mode = args.length > 0 ? args[0] : "burn";
        long seconds = args.length > 1 ? Long.parseLong(args[1]) : 0;
        System.out.println("ready");
        System.out.flush();
        sink = jAlpha(mode, seconds); // MARK call-alpha
    } // MARK main-end

    static long jAlpha(String mode, long seconds) { // MARK alpha
        long x = seconds + 1;
        return jBeta(mode, seconds, x); // MARK call-beta
    } // MARK alpha-end

    static long jBeta(String mode, long seconds, long x) { // MARK beta
        if (mode.equals("burn")) {
            return jGammaBurn(Long.MAX_VALUE); // MARK call-gamma
        }
        long end = System.nanoTime() + seconds * 1_000_000_000L;
        while (System.nanoTime() < end) {
            x ^= jGammaBurn(2 * 5_000_000L); // MARK call-gamma-mix
            x ^= jDeltaBurn(5_000_000L); // MARK call-delta
        }
        return x;
    } // MARK beta-end

    static long jGammaBurn(long n) { // MARK gamma
        long x = n;
        for (long i = 0; i < n; i++) {
            x = x * 6364136223846793005L + 1442695040888963407L;
            x ^= x >>> 29;
        }
        return x;
    } // MARK gamma-end

    static long jDeltaBurn(long n) { // MARK delta
        long x = n;
        for (long i = 0; i < n; i++) {
            x = x * 2862933555777941757L + 3037000493L;
            x ^= x >>> 31;
        }
        return x;
    } // MARK delta-end
}
