// The native half of JniBurn.java: Java_JniBurn_nativeBurn calls
// jniburn_middle, which calls back into Java (JniBurn.jCallback). Both are
// global, not inlined and not tail calls (the test builds this without
// frame pointers, with -fno-inline -fno-optimize-sibling-calls), so each is
// a frame of its own that only the unwind tables find.
#include <jni.h>

static jmethodID callback;

void jniburn_middle(JNIEnv *env, jclass cls, jlong n) {
	if (callback == NULL) {
		callback = (*env)->GetStaticMethodID(env, cls, "jCallback", "(J)V");
		if (callback == NULL) {
			return; // NoSuchMethodError is pending: Java throws it on return
		}
	}
	(*env)->CallStaticVoidMethod(env, cls, callback, n);
}

JNIEXPORT jlong JNICALL Java_JniBurn_nativeBurn(JNIEnv *env, jclass cls, jlong n) {
	jniburn_middle(env, cls, n);
	return (*env)->ExceptionCheck(env) ? 0 : 1;
}
