// JniBurn: main -> jOuter -> nativeBurn, a native method in libjniburn.so
// (jniburn.c): Java_JniBurn_nativeBurn -> jniburn_middle ->
// CallStaticVoidMethod -> jCallback -> jInnerBurn, which burns. One stack
// mixes Java, C and Java again. The library's directory is given with
// -Djava.library.path. Prints "ready" before the chain starts; runs until
// killed. Lines marked "// MARK name" are read by the tests.
public class JniBurn {
    static volatile long sink;

    static native long nativeBurn(long n);

    public static void main(String[] args) { // MARK main
        System.loadLibrary("jniburn");
        System.out.println("ready");
        System.out.flush();
        sink = jOuter(args.length); // MARK call-outer
    } // MARK main-end

    static long jOuter(long x) { // MARK outer
        while (true) {
            x += nativeBurn(x); // MARK call-native
            if (x < 0) { // never: x counts up from 0
                return x;
            }
        }
    } // MARK outer-end

    // Called from C (jniburn_middle) with CallStaticVoidMethod.
    static void jCallback(long n) { // MARK callback
        sink = jInnerBurn(n); // MARK call-inner
    } // MARK callback-end

    static long jInnerBurn(long n) { // MARK inner
        long x = n;
        for (int i = 0; i < 1_000_000; i++) {
            x = x * 6364136223846793005L + 1442695040888963407L;
            x ^= x >>> 29;
        }
        return x;
    } // MARK inner-end
}
