"""dpaudit.mechanisms"""
