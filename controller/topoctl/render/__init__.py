"""Plan rendering: addresses (`addressing`), one HostState per host (`hoststate`), the whole
Plan document (`plan`), and the human summary (`explain`)."""
