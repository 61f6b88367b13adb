# A CPU-bound chain main -> alpha -> beta -> gamma_burn for the profiler's
# tests. Modes: "ruby" (the chain on the main thread), "block" (beta runs
# the leaf in a block it yields to), "class" (beta reaches the leaf through
# a singleton and an instance method of a class), "thread" (the chain on a
# second thread, the main thread waiting on it).
$stdout.sync = true

def gamma_burn(n)
  # A prologue long enough that the loop's instructions lie past the first
  # 54 positions of the line table (its second part).
  a1 = n + 1; a2 = a1 + 1; a3 = a2 + 1; a4 = a3 + 1; a5 = a4 + 1
  a6 = a5 + 1; a7 = a6 + 1; a8 = a7 + 1; a9 = a8 + 1; a10 = a9 + 1
  a11 = a10 + 1; a12 = a11 + 1; a13 = a12 + 1; a14 = a13 + 1
  x = a14 - a14
  i = 0
  while i < n
    x += i * i % 7 # the leaf's work
    i += 1
  end
  x
end

def with_block
  yield + 1
end

class Burner
  def self.start(n)
    new.run(n) # Burner.start's call
  end

  def run(n)
    gamma_burn(n) # Burner#run's call
  end
end

def beta(mode)
  if mode == "block"
    with_block { gamma_burn(200_000) } # beta's block
  elsif mode == "class"
    Burner.start(200_000) # beta's class call
  else
    gamma_burn(200_000) # beta's call
  end
end

def alpha(mode)
  beta(mode) + 1 # alpha's call
end

def main(mode)
  said = false
  loop do
    alpha(mode) # main's call
    unless said
      puts "ready"
      said = true
    end
  end
end

mode = ARGV[0] || "ruby"
if mode == "thread"
  Thread.new { main(mode) }.join # the thread's start
else
  main(mode) # the script's call
end
