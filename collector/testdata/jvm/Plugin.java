// Plugin is compiled apart from Churn, into a directory off the class path:
// Churn loads it anew each round with a fresh URLClassLoader, so each
// round's Plugin and Plugin.Local are new classes whose methods are
// interpreted, compiled, deoptimized (run's phases change spin's receiver
// types), recompiled, and unloaded with their loader.
public class Plugin implements Churn.Task {
    static final class Local implements Churn.Shape {
        public long area(long x) {
            return x * 11 + 3;
        }
    }

    public long run(long x) {
        Churn.Shape local = new Local();
        x = spin(new Churn.Shape[] {local}, x, 2_000_000);
        x = spin(new Churn.Shape[] {local, new Churn.Circle()}, x, 2_000_000);
        x = spin(new Churn.Shape[] {local, new Churn.Circle(), new Churn.Square(), new Churn.Tri()}, x, 2_000_000);
        return x;
    }

    static long spin(Churn.Shape[] shapes, long x, int n) {
        for (int i = 0; i < n; i++) {
            x = shapes[i % shapes.length].area(x);
        }
        return x;
    }
}
