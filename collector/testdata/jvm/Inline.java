// Inline: main -> drive -> loop, where loop calls mid, and mid calls leaf,
// in a hot loop. mid and leaf are small static methods: C2 inlines them
// into loop's compiled code, so their frames exist only in its debug
// information. The work is in leaf. Prints "ready" before the chain
// starts; runs until killed. Lines marked "// MARK name" are read by the
// tests.
public class Inline {
    static volatile long sink;

    public static void main(String[] args) { // MARK main
        System.out.println("ready");
        System.out.flush();
        sink = drive(args.length); // MARK call-drive
    } // MARK main-end

    static long drive(long seed) { // MARK drive
        return loop(seed + 1); // MARK call-loop
    } // MARK drive-end

    static long loop(long x) { // MARK loop
        while (true) {
            x = mid(x); // MARK call-mid
            if (x == 42) {
                sink = x;
            }
        }
    } // MARK loop-end

    static long mid(long x) { // MARK mid
        return leaf(x) ^ (x >>> 7); // MARK call-leaf
    } // MARK mid-end

    static long leaf(long x) { // MARK leaf
        for (int i = 0; i < 64; i++) {
            x = x * 6364136223846793005L + 1442695040888963407L;
            x ^= x >>> 29;
        }
        return x;
    } // MARK leaf-end
}
