package symbolize

// lru is a map with a recency order, least recently used at the tail. It is
// not safe for concurrent use; the Symbolizer guards every lru with its
// mutex. Bounds are enforced by the caller, which evicts with removeOldest
// and counts what it drops.
type lru[K comparable, V any] struct {
	items map[K]*lruNode[K, V]
	head  lruNode[K, V] // sentinel: head.next is the newest, head.prev the oldest
}

type lruNode[K comparable, V any] struct {
	key        K
	val        V
	prev, next *lruNode[K, V]
}

func newLRU[K comparable, V any]() *lru[K, V] {
	c := &lru[K, V]{items: make(map[K]*lruNode[K, V])}
	c.head.next, c.head.prev = &c.head, &c.head
	return c
}

func (c *lru[K, V]) len() int { return len(c.items) }

// get returns the value for k and marks it most recently used.
func (c *lru[K, V]) get(k K) (V, bool) {
	n, ok := c.items[k]
	if !ok {
		var zero V
		return zero, false
	}
	c.unlink(n)
	c.pushFront(n)
	return n.val, true
}

// peek returns the value for k without changing the order.
func (c *lru[K, V]) peek(k K) (V, bool) {
	n, ok := c.items[k]
	if !ok {
		var zero V
		return zero, false
	}
	return n.val, true
}

// put sets the value for k and marks it most recently used.
func (c *lru[K, V]) put(k K, v V) {
	if n, ok := c.items[k]; ok {
		n.val = v
		c.unlink(n)
		c.pushFront(n)
		return
	}
	n := &lruNode[K, V]{key: k, val: v}
	c.items[k] = n
	c.pushFront(n)
}

// remove drops the entry for k, if any.
func (c *lru[K, V]) remove(k K) {
	if n, ok := c.items[k]; ok {
		c.unlink(n)
		delete(c.items, k)
	}
}

// removeOldest drops and returns the least recently used entry.
func (c *lru[K, V]) removeOldest() (K, V, bool) {
	n := c.head.prev
	if n == &c.head {
		var k K
		var v V
		return k, v, false
	}
	c.unlink(n)
	delete(c.items, n.key)
	return n.key, n.val, true
}

func (c *lru[K, V]) unlink(n *lruNode[K, V]) {
	n.prev.next = n.next
	n.next.prev = n.prev
	n.prev, n.next = nil, nil
}

func (c *lru[K, V]) pushFront(n *lruNode[K, V]) {
	n.prev = &c.head
	n.next = c.head.next
	c.head.next.prev = n
	c.head.next = n
}
