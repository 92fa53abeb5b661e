"""The worker processes: started, fed chunks of questions, restarted when they die, stopped."""
