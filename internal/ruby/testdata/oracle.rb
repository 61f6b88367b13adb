# Two CPU-bound leaves in a known proportion (gamma_burn three calls in
# four, delta_burn one), and an oracle: a second thread samples the main
# thread's innermost frame with Thread#backtrace_locations every 10 ms and
# writes its counts ("gamma delta") to the file ARGV[0] once a second.
$stdout.sync = true

def gamma_burn(n)
  x = 0
  i = 0
  while i < n
    x += i * i % 7
    i += 1
  end
  x
end

def delta_burn(n)
  x = 0
  i = 0
  while i < n
    x += i * i % 5
    i += 1
  end
  x
end

def beta(k)
  k % 4 == 3 ? delta_burn(50_000) : gamma_burn(50_000)
end

out = ARGV[0]
main = Thread.current
counts = Hash.new(0)
Thread.new do
  last = Time.now
  loop do
    sleep 0.01
    loc = main.backtrace_locations(0, 1)&.first
    counts[loc.label] += 1 if loc
    if Time.now - last >= 1
      File.write(out + ".tmp", "#{counts["gamma_burn"]} #{counts["delta_burn"]}\n")
      File.rename(out + ".tmp", out)
      last = Time.now
    end
  end
end

k = 0
said = false
loop do
  beta(k)
  k += 1
  unless said
    puts "ready"
    said = true
  end
end
