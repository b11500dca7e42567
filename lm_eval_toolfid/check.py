"""placeholder"""
def add_check_command(sub):
    pass
