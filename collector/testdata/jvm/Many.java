import java.io.ByteArrayOutputStream;
import java.io.DataOutputStream;
import java.io.IOException;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.function.IntUnaryOperator;

// Many gives HotSpot tens of thousands of distinct small methods to
// compile, for the test that naming the frames of a JVM with 50,000
// compiled methods stays within its bounds. At start it writes, with the
// small class file writer below, `classes` classes ManyG0, ManyG1, ...
// (source file ManyG<i>.gen), each with `methods` static methods
// m0(I)I ... and an applyAsInt(I)I that calls them all in turn. Each m<k>
// is a short loop with constants of its own (so every method is distinct)
// and more bytecode than C1 inlines (35 bytes), so each is compiled on
// its own; every instruction of it has a line of its own in the line
// number table (line 10k+1 ...). The classes are loaded by a class loader
// of Many's and called through IntUnaryOperator.
//
// It prints "ready" once they are loaded, warms them up class after class
// (then prints "warm")
// (run it with -Xbatch, which compiles a method as its caller waits, and
// HotSpot's compile queue stays short: tiered compilation scans it whole
// for every task it picks, so 50,000 methods queued at once would take
// minutes), then runs rounds until killed: each round calls every class's
// applyAsInt once and the first `hot` classes' `hotRepeat` times more (with
// 5,000 classes, 20 hot ones and 250: half the calls go to a hot set of
// 220 methods, the rest spread over all of them).
//
//   java Many classes methods hot hotRepeat
public class Many {
    static volatile int sink;

    public static void main(String[] args) throws Exception {
        int classes = Integer.parseInt(args[0]);
        int methods = Integer.parseInt(args[1]);
        int hot = Integer.parseInt(args[2]);
        int hotRepeat = Integer.parseInt(args[3]);
        Loader loader = new Loader();
        IntUnaryOperator[] ops = new IntUnaryOperator[classes];
        for (int i = 0; i < classes; i++) {
            String name = "ManyG" + i;
            byte[] b = classFile(name, i, methods);
            ops[i] = (IntUnaryOperator) loader.define(name, b).getDeclaredConstructor().newInstance();
        }
        System.out.println("ready");
        System.out.flush();
        int x = 1;
        // Warm-up, class after class: WARM calls each, past the invocation
        // and loop counts at which HotSpot compiles its methods.
        for (int i = 0; i < classes; i++) {
            for (int r = 0; r < WARM; r++) {
                x = ops[i].applyAsInt(x);
            }
        }
        System.out.println("warm");
        System.out.flush();
        for (;;) {
            for (int i = 0; i < classes; i++) {
                x = ops[i].applyAsInt(x);
            }
            for (int r = 0; r < hotRepeat; r++) {
                for (int i = 0; i < hot; i++) {
                    x = ops[i].applyAsInt(x);
                }
            }
            sink = x;
        }
    }

    static final class Loader extends ClassLoader {
        Loader() {
            super(Many.class.getClassLoader());
        }

        Class<?> define(String name, byte[] b) {
            return defineClass(name, b, 0, b.length);
        }
    }

    // The loop count of each m<k>.
    static final int LOOP = 24;

    // The warm-up's calls of each class: tiered HotSpot compiles a method
    // past 200 invocations, or past 100 whose invocations and loop
    // back-edges add up to 2,000.
    static final int WARM = 250;

    // classFile writes class `name` (version 49: no stack map frames
    // needed) implementing IntUnaryOperator, with `methods` methods m<k>
    // whose constants derive from seed and k.
    static byte[] classFile(String name, int seed, int methods) throws IOException {
        Pool cp = new Pool();
        int thisClass = cp.cls(name);
        int superClass = cp.cls("java/lang/Object");
        int iface = cp.cls("java/util/function/IntUnaryOperator");
        int objInit = cp.method("java/lang/Object", "<init>", "()V");
        int code = cp.utf8("Code");
        int lnt = cp.utf8("LineNumberTable");
        int sf = cp.utf8("SourceFile");
        int sfName = cp.utf8(name + ".gen");
        List<byte[]> ms = new ArrayList<>();

        // <init>: aload_0; invokespecial Object.<init>; return
        Code init = new Code();
        init.line(1).op(0x2a).op(0xb7).u2(objInit).op(0xb1);
        ms.add(init.method(cp, 0x0001, "<init>", "()V", 1, 1, code, lnt));

        for (int k = 0; k < methods; k++) {
            int h = seed * 7919 + k * 104729;
            Code c = new Code();
            int line = 10 * k + 1;
            c.line(line).op(0x1a).op(0x13).u2(cp.integer(h ^ 0x5bd1e995)).op(0x82).op(0x3c); // a = x ^ c1
            c.line(line + 1).op(0x03).op(0x3d); // i = 0
            int head = c.pc();
            c.line(line + 2).op(0x1c).op(0x10).op(LOOP); // iload_2; bipush LOOP
            int exit = c.pc();
            c.op(0xa2).u2(0); // if_icmpge end (patched)
            c.line(line + 3).op(0x1b).op(0x13).u2(cp.integer(h | 1)).op(0x68); // a * c2
            c.op(0x1c).op(0x13).u2(cp.integer(h >>> 3)).op(0x82).op(0x60).op(0x3c); // + (i ^ c3)
            c.line(line + 4).op(0x1b).op(0x1b).op(0x10).op(7 + k % 5).op(0x7c).op(0x82).op(0x3c); // a ^= a >>> s
            c.line(line + 5).op(0x84).op(2).op(1); // i++
            int back = c.pc();
            c.op(0xa7).u2(head - back); // goto head
            c.patch(exit + 1, c.pc() - exit);
            c.line(line + 6).op(0x1b).op(0xac); // return a
            ms.add(c.method(cp, 0x0009, "m" + k, "(I)I", 3, 3, code, lnt));
        }

        // applyAsInt: s = 0; s += m<k>(x) for each k; return s
        Code apply = new Code();
        apply.line(10 * methods + 1).op(0x03).op(0x3d);
        for (int k = 0; k < methods; k++) {
            apply.line(10 * methods + 2 + k).op(0x1c).op(0x1b).op(0xb8).u2(cp.method(name, "m" + k, "(I)I")).op(0x60).op(0x3d);
        }
        apply.line(10 * methods + 2 + methods).op(0x1c).op(0xac);
        ms.add(apply.method(cp, 0x0001, "applyAsInt", "(I)I", 2, 3, code, lnt));

        ByteArrayOutputStream bo = new ByteArrayOutputStream();
        DataOutputStream out = new DataOutputStream(bo);
        out.writeInt(0xCAFEBABE);
        out.writeShort(0);
        out.writeShort(49);
        cp.write(out);
        out.writeShort(0x0021); // public super
        out.writeShort(thisClass);
        out.writeShort(superClass);
        out.writeShort(1);
        out.writeShort(iface);
        out.writeShort(0); // fields
        out.writeShort(ms.size());
        for (byte[] m : ms) {
            out.write(m);
        }
        out.writeShort(1); // attributes: SourceFile
        out.writeShort(sf);
        out.writeInt(2);
        out.writeShort(sfName);
        out.flush();
        return bo.toByteArray();
    }

    // Pool is a constant pool being written.
    static final class Pool {
        final ByteArrayOutputStream bytes = new ByteArrayOutputStream();
        final DataOutputStream out = new DataOutputStream(bytes);
        final Map<String, Integer> index = new HashMap<>();
        int next = 1;

        int add(String key, byte[] entry) {
            Integer i = index.get(key);
            if (i != null) {
                return i;
            }
            bytes.write(entry, 0, entry.length);
            index.put(key, next);
            return next++;
        }

        int utf8(String s) throws IOException {
            ByteArrayOutputStream b = new ByteArrayOutputStream();
            DataOutputStream d = new DataOutputStream(b);
            d.writeByte(1);
            d.writeUTF(s);
            return add("U" + s, b.toByteArray());
        }

        int integer(int v) {
            return add("I" + v, new byte[] {3, (byte) (v >>> 24), (byte) (v >>> 16), (byte) (v >>> 8), (byte) v});
        }

        int cls(String name) throws IOException {
            int n = utf8(name);
            return add("C" + name, new byte[] {7, (byte) (n >>> 8), (byte) n});
        }

        int nameAndType(String name, String desc) throws IOException {
            int n = utf8(name), d = utf8(desc);
            return add("N" + name + " " + desc, new byte[] {12, (byte) (n >>> 8), (byte) n, (byte) (d >>> 8), (byte) d});
        }

        int method(String owner, String name, String desc) throws IOException {
            int c = cls(owner), nt = nameAndType(name, desc);
            return add("M" + owner + "." + name + desc, new byte[] {10, (byte) (c >>> 8), (byte) c, (byte) (nt >>> 8), (byte) nt});
        }

        void write(DataOutputStream o) throws IOException {
            o.writeShort(next);
            o.write(bytes.toByteArray());
        }
    }

    // Code is a method's bytecode with its line number table.
    static final class Code {
        final ByteArrayOutputStream code = new ByteArrayOutputStream();
        final List<int[]> lines = new ArrayList<>();

        int pc() {
            return code.size();
        }

        Code op(int b) {
            code.write(b);
            return this;
        }

        Code u2(int v) {
            code.write(v >>> 8);
            code.write(v);
            return this;
        }

        Code line(int line) {
            lines.add(new int[] {pc(), line});
            return this;
        }

        void patch(int at, int v) {
            byte[] b = code.toByteArray();
            b[at] = (byte) (v >>> 8);
            b[at + 1] = (byte) v;
            code.reset();
            code.write(b, 0, b.length);
        }

        byte[] method(Pool cp, int access, String name, String desc, int maxStack, int maxLocals, int codeAttr, int lntAttr) throws IOException {
            ByteArrayOutputStream b = new ByteArrayOutputStream();
            DataOutputStream o = new DataOutputStream(b);
            byte[] bc = code.toByteArray();
            o.writeShort(access);
            o.writeShort(cp.utf8(name));
            o.writeShort(cp.utf8(desc));
            o.writeShort(1); // attributes: Code
            o.writeShort(codeAttr);
            int lntLen = 2 + 4 * lines.size();
            o.writeInt(2 + 2 + 4 + bc.length + 2 + 2 + 2 + 4 + lntLen);
            o.writeShort(maxStack);
            o.writeShort(maxLocals);
            o.writeInt(bc.length);
            o.write(bc);
            o.writeShort(0); // exception table
            o.writeShort(1); // attributes: LineNumberTable
            o.writeShort(lntAttr);
            o.writeInt(lntLen);
            o.writeShort(lines.size());
            for (int[] l : lines) {
                o.writeShort(l[0]);
                o.writeShort(l[1]);
            }
            o.flush();
            return b.toByteArray();
        }
    }
}
