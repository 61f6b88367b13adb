// JSleep parks its main thread in interpreted frames (run it with -Xint):
// main -> jOuter -> jSleeper -> Thread.sleep, so the interpreter's frame
// slots can be found on its stack.
public class JSleep {
    public static void main(String[] args) throws Exception {
        System.out.println("ready");
        System.out.flush();
        jOuter(args.length > 0 ? Integer.parseInt(args[0]) : 30);
    }

    static void jOuter(int seconds) throws Exception {
        for (int i = 0; i < seconds; i++) {
            jSleeper();
        }
    }

    static void jSleeper() throws Exception {
        Thread.sleep(1000);
    }
}
