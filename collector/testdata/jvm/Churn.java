import java.io.File;
import java.net.URL;
import java.net.URLClassLoader;

// Churn keeps HotSpot's code cache moving, for the tests that no frame is
// named wrongly. Each round it
//   - runs Churn's hot call site (callSite, s.area) through phases whose
//     receiver types change, so the compiled code that inlined one area()
//     hits an uncommon trap, is deoptimized and compiled again;
//   - loads Plugin (from the directory in the first argument, which is not
//     on the class path) with a new URLClassLoader, whose run() compiles
//     its own loops and deoptimizes them the same way, with a receiver
//     class of its own loader, then drops the loader;
//   - every fourth round calls System.gc(), which unloads the old loaders'
//     classes and frees their compiled code for other methods to reuse.
// Prints "ready" once before the first round; runs until killed.
public class Churn {
    public interface Shape {
        long area(long x);
    }

    public interface Task {
        long run(long x);
    }

    public static final class Circle implements Shape {
        public long area(long x) {
            return x * 3 + 1;
        }
    }

    public static final class Square implements Shape {
        public long area(long x) {
            return (x ^ (x >>> 3)) * 5;
        }
    }

    public static final class Tri implements Shape {
        public long area(long x) {
            return x * 7 - (x >>> 11);
        }
    }

    static volatile long sink;

    public static void main(String[] args) throws Exception {
        URL[] plugins = {new File(args[0]).toURI().toURL()};
        System.out.println("ready");
        System.out.flush();
        long x = 1;
        for (int round = 0; ; round++) {
            x = phases(round, x);
            try (URLClassLoader loader = new URLClassLoader(plugins, Churn.class.getClassLoader())) {
                Task t = (Task) loader.loadClass("Plugin").getDeclaredConstructor().newInstance();
                x = t.run(x);
            }
            if (round % 4 == 3) {
                System.gc();
            }
            sink = x;
        }
    }

    static long callSite(Shape s, long x) {
        return s.area(x);
    }

    static long spin(Shape[] shapes, long x, int n) {
        for (int i = 0; i < n; i++) {
            x = callSite(shapes[i % shapes.length], x);
        }
        return x;
    }

    static long phases(int round, long x) {
        Shape c = new Circle(), s = new Square(), t = new Tri();
        switch (round % 3) {
            case 0:
                x = spin(new Shape[] {c}, x, 1_000_000);
                x = spin(new Shape[] {c, s}, x, 1_000_000);
                break;
            case 1:
                x = spin(new Shape[] {t}, x, 1_000_000);
                x = spin(new Shape[] {s, t}, x, 1_000_000);
                break;
            default:
                x = spin(new Shape[] {s}, x, 1_000_000);
                x = spin(new Shape[] {c, s, t}, x, 1_000_000);
        }
        return x;
    }
}
